//! docs/benchmarks.md and its plot, written from one run's results.

use crate::scenarios::{Results, Settings, Throughput};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

pub fn write(output: &Path, settings: &Settings, results: &Results) -> anyhow::Result<()> {
    if let Some(dir) = output.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let plot_name = "benchmarks-throughput.svg";
    let plot = output.with_file_name(plot_name);
    std::fs::write(&plot, throughput_svg(results))?;
    let mut page = markdown(settings, results, plot_name);
    // bench/cluster.sh writes its own sections (figures from a cluster); a run here keeps them.
    let old = std::fs::read_to_string(output).unwrap_or_default();
    for section in [
        cluster_section(&old),
        titled_section(&old, POOL_POD_HEADING),
        titled_section(&old, POOL_DEFAULTS_HEADING),
    ]
    .into_iter()
    .flatten()
    {
        page.push('\n');
        page.push_str(section.trim_end());
        page.push('\n');
    }
    std::fs::write(output, page)?;
    Ok(())
}

/// The section of `page` under `heading`, to the next heading of its level.
fn titled_section<'a>(page: &'a str, heading: &str) -> Option<&'a str> {
    let start = page.find(heading)?;
    let rest = &page[start + heading.len()..];
    let end = [rest.find("\n## "), rest.find("\n<!-- ")]
        .into_iter()
        .flatten()
        .min()
        .map_or(page.len(), |end| start + heading.len() + end + 1);
    Some(&page[start..end])
}

const OUTBOUND_HEADING: &str = "## Outbound calls";
/// The section bench/cluster.sh's pool pod run writes (`pool_pod::section`): named here,
/// where a run of the local benchmarks keeps it, so the report needs nothing of the run.
pub const POOL_POD_HEADING: &str = "## Pool density on the cluster: a thousand Functions in one pool pod";
/// The section of bench/cluster.sh's run at the operator's defaults (`pool_pod::defaults`).
pub const POOL_DEFAULTS_HEADING: &str = "## A hundred Go Functions at the operator's defaults";

/// Replaces the outbound section of an existing report with a new run's (`--only outbound`).
pub fn write_outbound_section(output: &Path, settings: &Settings, rows: &[Throughput]) -> anyhow::Result<()> {
    write_section(output, OUTBOUND_HEADING, &outbound_section(settings, rows))
}

/// Replaces the section under `heading` (to the next `## `) with `section`, or puts it
/// before "## Memory" when the page has none yet.
pub fn write_section(output: &Path, heading: &str, section: &str) -> anyhow::Result<()> {
    let page = std::fs::read_to_string(output)?;
    let page = match page.find(heading) {
        Some(start) => {
            let end = page[start + heading.len()..]
                .find("\n## ")
                .map_or(page.len(), |end| start + heading.len() + end + 1);
            format!("{}{section}{}", &page[..start], &page[end..])
        }
        None => match page.find("## Memory") {
            Some(at) => format!("{}{section}{}", &page[..at], &page[at..]),
            None => format!("{page}\n{section}"),
        },
    };
    std::fs::write(output, page)?;
    Ok(())
}

fn outbound_section(settings: &Settings, rows: &[Throughput]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{OUTBOUND_HEADING}\n");
    let _ = writeln!(
        md,
        "A Go handler that calls an upstream with `http.Get` on every request and copies its body through \
         (the upstream: the native axum hello, on loopback). `wrk --latency -t2 -c{} -d{}s`, after a 1 s warm-up; \
         client, server and upstream share the 2 cores. Ratios are against native Go, in the same run ({}).\n",
        settings.connections,
        settings.load_seconds,
        chrono_free_now()
    );
    let _ = writeln!(md, "| server | requests/s | ratio | p50 | p99 |\n|---|---|---|---|---|");
    let first = rows.first().map_or(1.0, |row| row.load.requests_per_second);
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.2} | {:.2} ms | {:.2} ms |",
            row.name,
            row.load.requests_per_second,
            row.load.requests_per_second / first,
            row.load.p50_ms,
            row.load.p99_ms,
        );
    }
    if let (Some(native), Some(ours)) = (rows.first(), rows.get(1)) {
        let _ = writeln!(
            md,
            "\n- a fresh instance per request, calling out, vs native Go: **{:.2}×** (target ≥ 0.5×)",
            ours.load.requests_per_second / native.load.requests_per_second
        );
    }
    let _ = writeln!(
        md,
        "- why shared instances pass native Go here: Go's default transport keeps at most 2 idle connections per \
         host (`MaxIdleConnsPerHost`), so under 16 concurrent requests native Go opens and closes connections to \
         the upstream; the runtime's pooled client keeps them. A fresh instance per request pays for the instance \
         (see \"Per-request cost\"), not for the call."
    );
    let _ = writeln!(
        md,
        "\n`outbound`: run alone with `bench/run.sh --only outbound` (rewrites this section).\n"
    );
    md
}

/// The run's date and time in UTC, from the system clock (no date crate for one line).
pub fn chrono_free_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_default()
}

/// Where bench/cluster.sh's section starts and ends in docs/benchmarks.md.
const CLUSTER_BEGIN: &str = "<!-- bench/cluster.sh begin -->";
const CLUSTER_END: &str = "<!-- bench/cluster.sh end -->";

fn cluster_section(page: &str) -> Option<&str> {
    let start = page.find(CLUSTER_BEGIN)?;
    let end = page[start..].find(CLUSTER_END)? + start + CLUSTER_END.len();
    Some(&page[start..end])
}

fn seconds(duration: Duration) -> String {
    let s = duration.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1000.0)
    }
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or("?".into(), |kb| format!("{:.0} GiB", kb / 1024.0 / 1024.0));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores ({cpu}), {memory} memory, Linux {}", kernel.trim())
}

fn markdown(settings: &Settings, results: &Results, plot_name: &str) -> String {
    let mut md = String::new();
    let mode = if settings.quick {
        "quick (`bench/run.sh --quick`)"
    } else {
        "full (`bench/run.sh`)"
    };
    let date = std::process::Command::new("date")
        .arg("-u")
        .arg("+%Y-%m-%d %H:%M UTC")
        .output()
        .ok();
    let date = date
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let _ = writeln!(md, "# Benchmarks\n");
    let _ = writeln!(
        md,
        "Written by `bench/run.sh` ({mode}) on {date}, on {}. Absolute numbers drift from run to run on a shared \
         2-core machine: the ratios, taken in the same run, are what count. Every figure comes from a function in \
         `bench/src/scenarios.rs`, named below each table.\n",
        machine()
    );

    let _ = writeln!(md, "## Cold start: from a clean start to the first 200\n");
    let _ = writeln!(md, "| path | time | note |\n|---|---|---|");
    for row in &results.cold_starts {
        let _ = writeln!(md, "| {} | {} | {} |", row.name, seconds(row.time), row.detail);
    }
    let goless = results.cold_starts.first().map(|r| r.time);
    let row = |part: &str| {
        results
            .cold_starts
            .iter()
            .find(|r| r.name.contains("Goless sample") && r.name.contains(part))
    };
    if let (Some(goless), Some(new_pod), Some(restart)) = (goless, row("new pod"), row("restart")) {
        let ratio = |ours: &crate::scenarios::Timed| goless.as_secs_f64() / ours.time.as_secs_f64();
        let _ = writeln!(
            md,
            "\nGoless's path over ours, for a **new pod** (what a rollout, a scale-out or a first apply gets): \
             **{:.0}×** faster ({}; target: 20 ms, {}). For a restarted pod with its cache: {:.0}×.\n",
            ratio(new_pod),
            seconds(new_pod.time),
            // Not rounded: 20.5 ms misses a 20 ms target.
            if new_pod.time <= std::time::Duration::from_millis(20) {
                "met"
            } else {
                "not met in this run"
            },
            ratio(restart)
        );
    }
    let _ = writeln!(
        md,
        "`cold_starts`: Goless's way is what its init container does at every pod start — generate `main`, \
         `go build` with an empty `GOCACHE`, start the server — measured from before `go build` to the first 200. \
         Ours starts `wasmless-runtime` on a module built once: as a new pod does (an empty cache directory, the \
         builder's precompiled code pinned by `--code-digest`), as a pod of a build without code does (it compiles), \
         and with the cache a previous start wrote (what a restarted pod sees); medians of {} starts.\n",
        settings.repetitions
    );

    let _ = writeln!(md, "## Throughput and tail latency\n");
    let _ = writeln!(
        md,
        "`wrk --latency -t2 -c{} -d{}s` against `GET /` on loopback, after a 1 s warm-up; client and server share \
         the 2 cores. Ratios are against the first row.\n",
        settings.connections, settings.load_seconds
    );
    let _ = writeln!(
        md,
        "| server | requests/s | ratio | p50 | p99 | errors |\n|---|---|---|---|---|---|"
    );
    let first = results
        .throughput
        .first()
        .map_or(1.0, |row| row.load.requests_per_second);
    for row in &results.throughput {
        let load = &row.load;
        let _ = writeln!(
            md,
            "| {} | {:.0} | {:.2} | {:.2} ms | {:.2} ms | {} |",
            row.name,
            load.requests_per_second,
            load.requests_per_second / first,
            load.p50_ms,
            load.p99_ms,
            load.errors
        );
    }
    let _ = writeln!(md, "\n![requests per second]({plot_name})\n");
    let rps = |needle: &str| {
        results
            .throughput
            .iter()
            .find(|r| r.name.contains(needle))
            .map(|r| r.load.requests_per_second)
    };
    if let (Some(ours), Some(axum)) = (rps("wasmless-runtime, Rust"), rps("native axum")) {
        let _ = writeln!(
            md,
            "- hello component vs native axum: **{:.2}×** (target ≥ 0.5×)",
            ours / axum
        );
        if let (Some(native_go), Some(reactor)) = (rps("native Go net/http"), rps("Go reactor, a fresh instance")) {
            let _ = writeln!(
                md,
                "- Goless sample, Go reactor with a fresh instance per request, vs native Go net/http: **{:.2}×** (target ≥ 0.25×){}",
                reactor / native_go,
                rps("Goless sample (Go over CGI")
                    .map(|cgi| format!("; over CGI, as before the reactor: {:.2}×", cgi / native_go))
                    .unwrap_or_default()
            );
            if let Some(shared) = rps("Go reactor, shared instances") {
                let _ = writeln!(
                    md,
                    "- Goless sample, Go reactor with shared instances (`isolation: shared`), vs native Go net/http: **{:.2}×** (target ≥ 0.5×)",
                    shared / native_go
                );
            }
        }
        if let Some(wasmtime) = rps("wasmtime serve") {
            let _ = writeln!(
                md,
                "- hello component vs `wasmtime serve` (defaults): **{:.2}×** (target ≥ 1.5×)",
                ours / wasmtime
            );
        } else {
            let _ = writeln!(
                md,
                "- `wasmtime serve`: not measured (wasmtime-cli 48 was not available to this run)"
            );
        }
    }
    if let Some(axum) = rps("native axum") {
        let yardsticks: Vec<String> = crate::scenarios::BUSY_MICROS
            .iter()
            .filter_map(|micros| {
                let with_work = rps(&format!("+ {micros} µs of work"))?;
                Some(format!("{micros} µs: {:.2}×", with_work / axum))
            })
            .collect();
        let component = results
            .instantiate
            .iter()
            .find(|(name, _)| name.contains("component"))
            .map(|(_, micros)| format!("{micros:.1} µs"));
        if !yardsticks.is_empty() {
            let _ = writeln!(
                md,
                "- the same axum server spending a fixed time on each request, against itself without it: {}. \
                 Half of native axum's rate leaves about 10 µs per request for all a fresh instance costs. The hello \
                 component's costs {} in-process, in a hot loop (the per-request table below), and more under wrk, \
                 where it shares the two cores and their caches with the kernel's network path and with wrk. Half \
                 of axum is out of reach of a fresh wasmtime instance per request on this machine.",
                yardsticks.join(", "),
                component.unwrap_or_else(|| "the criterion figure (full run only)".into())
            );
        }
    }
    let _ = writeln!(
        md,
        "\n`throughput`: each server is started, answers once, is warmed for 1 s, then measured.\n"
    );

    md.push_str(&outbound_section(settings, &results.outbound));
    let _ = writeln!(md, "## Memory\n");
    let _ = writeln!(md, "| runtime | RSS idle | RSS peak under load |\n|---|---|---|");
    for row in results.throughput.iter().filter(|r| r.rss_idle_mib.is_some()) {
        let _ = writeln!(
            md,
            "| {} | {:.1} MiB | {:.1} MiB |",
            row.name,
            row.rss_idle_mib.unwrap_or(0.0),
            row.rss_peak_mib.unwrap_or(0.0)
        );
    }
    let _ = writeln!(
        md,
        "\n`throughput`: VmRSS after the first answer, and VmHWM after the wrk run, of a second start: \
         the first filled the compile cache, so no figure holds the memory of a compilation.\n"
    );

    let _ = writeln!(md, "## Per-request cost\n");
    if results.instantiate.is_empty() {
        let _ = writeln!(
            md,
            "The criterion bench did not run in this mode (`bench/run.sh` without `--quick` runs it).\n"
        );
    } else {
        let _ = writeln!(md, "| handler | instantiate + call, mean |\n|---|---|");
        for (name, micros) in &results.instantiate {
            let _ = writeln!(md, "| {name} | {micros:.1} µs |");
        }
        let _ = writeln!(
            md,
            "\n`criterion_estimates`: `cargo bench -p wasmless-runtime --bench instantiate` — a fresh instance \
             from the pool, the handler called through `LoadedHandler::invoke`, the body read; no HTTP.\n"
        );
    }
    if let Some(go) = &results.go_breakdown {
        let _ = writeln!(
            md,
            "The Go path over CGI (a Go `main`, or any WASI command), per request (from the runtime's own histograms: the least of three means over 300 sequential requests, the first request left out):\n"
        );
        let _ = writeln!(md, "| part | time |\n|---|---|");
        let _ = writeln!(md, "| instantiate (pooling allocator) | {:.0} µs |", go.instantiate_us);
        let _ = writeln!(
            md,
            "| Go runtime start-up (module linking net/http and net/http/cgi that answers at once, less its instantiation) | {:.0} µs |",
            go.go_start_us
        );
        let _ = writeln!(
            md,
            "| CGI request parsing, the handler, the response | {:.0} µs |",
            go.handler_us
        );
        let _ = writeln!(md, "| total, request to response headers | {:.0} µs |\n", go.total_us);
        let _ = writeln!(
            md,
            "`go_breakdown`: over CGI, Go starts inside every request; a Goless handler is built as a reactor instead, which skips that start-up (its request is broken down under \"Where the time goes\").\n"
        );
    }

    let _ = writeln!(md, "## Build\n");
    let _ = writeln!(
        md,
        "| language | cold | warm (source changed) | cache hit |\n|---|---|---|---|"
    );
    for row in &results.builds {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            row.language,
            row.cold.map_or("not run in quick mode".into(), seconds),
            seconds(row.warm),
            seconds(row.cache_hit)
        );
    }
    let _ = writeln!(
        md,
        "\n`build_times`: `wasmless-builder build` on the hello example; cold is an empty Go build cache or Rust \
         target directory, warm a changed source with those caches full, a hit the same source again (nothing compiles).\n"
    );
    md.push_str(ANALYSIS);
    md
}

/// What the numbers mean, kept beside the code that makes them.
const ANALYSIS: &str = "## Where the time goes\n\n\
- **Component requests** create a fresh `Store`, a `WasiCtx`, a `WasiHttpCtx` and a resource table, instantiate \
from the pool (memory and tables kept resident, so no `mmap` per request), run the component's own \
initialisation and the handler, and drop the store, which resets the dirty pages of linear memory (one \
`PAGEMAP_SCAN` ioctl finds them). A profile under wrk (`perf record -e cpu-clock -g` on the runtime) shows no \
single hot spot: about a quarter of the runtime's CPU goes to writing responses on loopback (the kernel waking \
wrk), a quarter to the instance (dropping the store alone is as much as instantiating), and the rest to hyper, \
tokio and the scheduler. Per request, the runtime makes three system calls: `recvfrom`, `writev` and that \
ioctl (`strace -c -f`). The handler runs on the connection's task until it answers, and each connection on \
one thread of its own runtime (a thread per core): a task spawned per request woke a second worker thread \
every time, which cost more than the instance, and tokio's work-stealing runtime parked and woke its workers \
around every request (60 against 39 µs of CPU per shared Go request, `perf stat -e task-clock`).\n\
- **Go requests** as a reactor start from the builder's snapshot of an initialised Go (a fresh instance per \
request, its memory a copy-on-write image), so Go's start-up is paid once, at build time; over CGI (the \
breakdown above, still of the CGI module) Go starts inside every request. A fresh reactor request under wrk \
(`perf record -g` on the runtime, ~95 µs of CPU each): a quarter is Go itself in wasm (the SDK's request and \
response, `net/http`'s types, the handler), a quarter the kernel's loopback TCP and scheduling, ~10% the \
reset of the pages the last request dirtied (the `PAGEMAP_SCAN` walk of the 5 MiB heap, then copying them \
back), ~10% instantiating and filling the function table lazily (Go calls through it), and the rest hyper, \
axum, tokio and malloc, with no single hot spot. A shared instance skips the instance and the reset: ~37 µs. \
Native Go spends ~15 µs per request in all.\n\
- **A new pod** reads the builder's compiled code (5.5 MB of LZ4 blocks for the Goless sample, 12 MB \
decompressed) block after block into huge pages, hashing it against `--code-digest` as it reads while the \
other core decompresses each 1 MiB block as soon as it is in (~2–3 ms of reading, ~3 ms of hashing and \
~7.5 ms of LZ4 on one core, overlapped), and runs the code where it was decompressed (`deserialize_raw`): no \
Cranelift, no copy. What is left: the first request (~2.2 ms, a fraction of a millisecond once warm: wasmtime \
makes the snapshot's memory image when it first instantiates it) and the process itself.\n\
- **Cold start** with a compiled-code cache hit is an `mmap` of the compiled code: the cache entry is named by \
the digest the module must have, and is written only after a module passed that check, so a hit reads neither \
the module nor its source (a registry may be down). A miss adds reading and verifying the module and Cranelift \
compiling it (seconds for a 5.8 MB Go module on 2 cores). What is left of a hit is mostly the process itself \
starting (a 180 MB binary: its relocations and page faults) and, for Go, the first request's Go start-up.\n";

/// A horizontal bar chart of requests per second.
fn throughput_svg(results: &Results) -> String {
    let rows = &results.throughput;
    let (width, bar_height, gap, label_width) = (900.0, 26.0, 10.0, 430.0);
    let height = 50.0 + rows.len() as f64 * (bar_height + gap);
    let max = rows.iter().map(|r| r.load.requests_per_second).fold(1.0, f64::max);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">Requests per second (wrk, GET /, higher is better)</text>\n"
    );
    for (index, row) in rows.iter().enumerate() {
        let y = 40.0 + index as f64 * (bar_height + gap);
        let length = (width - label_width - 90.0) * row.load.requests_per_second / max;
        let color = if row.name.starts_with("wasmless") {
            "#2f7ed8"
        } else {
            "#999999"
        };
        let _ = write!(
            svg,
            "<text x=\"10\" y=\"{:.0}\">{}</text>\n<rect x=\"{label_width}\" y=\"{y:.0}\" width=\"{length:.1}\" height=\"{bar_height}\" fill=\"{color}\"/>\n\
             <text x=\"{:.1}\" y=\"{:.0}\">{:.0}</text>\n",
            y + bar_height * 0.68,
            escape(&row.name),
            label_width + length + 6.0,
            y + bar_height * 0.68,
            row.load.requests_per_second
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::{CLUSTER_BEGIN, CLUSTER_END, cluster_section, titled_section};

    #[test]
    fn a_rewritten_page_keeps_the_cluster_section() {
        let page = format!("# Benchmarks\n\nlocal figures\n\n{CLUSTER_BEGIN}\n## On a cluster\n{CLUSTER_END}\n");
        let section = cluster_section(&page).expect("the section");
        assert!(section.starts_with(CLUSTER_BEGIN) && section.ends_with(CLUSTER_END));
        assert!(section.contains("## On a cluster"));
        assert!(!section.contains("local figures"));
        assert_eq!(cluster_section("# Benchmarks\n"), None);
    }

    #[test]
    fn a_rewritten_page_keeps_the_pool_pod_section() {
        let heading = super::POOL_POD_HEADING;
        let page = format!("# Benchmarks\n\n{heading}\n\n| a | b |\n\n## Memory\n\nlocal\n");
        let section = |page: &str| titled_section(page, heading).map(|s| s.trim_end().to_string());
        assert_eq!(section(&page), Some(format!("{heading}\n\n| a | b |")));
        let before_cluster = format!("{heading}\n\nfigures\n{CLUSTER_BEGIN}\n");
        assert_eq!(section(&before_cluster), Some(format!("{heading}\n\nfigures")));
        assert_eq!(titled_section("# Benchmarks\n", heading), None);
    }
}
