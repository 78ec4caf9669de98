//! Density of the pool (`wasmless-runtime --pool`): one process holding a thousand
//! distinct Functions, the Rust hello and the Goless sample mixed, each on its own
//! port with its own module digest and compiled code; what each costs in memory once
//! loaded, and the first request to a Function not yet loaded against one that is.

use crate::measure::{Resident, Server, resident_mib};
use crate::scenarios::{Module, Settings, build_example};
use anyhow::{Context, bail};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use wasmless_artifact::Digest;

pub struct Density {
    pub functions: usize,
    pub code_identical: bool,
    /// The pool as the operator starts it: the builder's code mapped from files.
    pub mapped: PoolRun,
    /// The same without a cache directory: the code copied into the pool's memory.
    pub copied: PoolRun,
    /// A new pool process with the node's code store (`--code-store`), after another put
    /// every Function's code there: each first request maps the store's file.
    pub stored: PoolRun,
}

pub struct DensityRow {
    pub name: String,
    pub functions: usize,
    /// Resident memory the pool grew by while loading them, per Function.
    pub rss_per_function_mib: f64,
    /// The part of it only the pool holds (anonymous and shared memory, not the mapped
    /// code file's page-cache pages).
    pub private_per_function_mib: f64,
    /// The native code of one (what the pool decompresses and maps to load it).
    pub code_mib: f64,
    pub first_request_p50_ms: f64,
    pub first_request_p90_ms: f64,
    pub loaded_p50_ms: f64,
    pub loaded_p90_ms: f64,
}

/// The first port of the pool's Functions; each takes the next.
const FIRST_PORT: u16 = 24000;

/// `functions` in all, `go_functions` of them the Goless sample (each of those is 11 MB of
/// module and code on disk, and 15 MB of memory once loaded).
pub fn density(settings: &Settings, functions: usize, go_functions: usize) -> anyhow::Result<Density> {
    eprintln!("building the hello modules with wasmless-builder");
    let rust = build_example(settings, "hello-rust", "rust")?;
    let go = build_example(settings, "hello-go", "go")?;
    let table = settings.work("pool-table");
    let modules = settings.work("pool-modules");
    let engine = wasmless_host::precompiled::precompile_engine().map_err(wasmtime_error)?;
    let rust_functions = functions.saturating_sub(go_functions);
    let mut code_identical = true;
    let mut groups = Vec::new();
    for (name, base, count, first) in [
        ("Rust hello (component)", &rust, rust_functions, 0),
        (
            "Goless sample (Go reactor, snapshotted)",
            &go,
            functions - rust_functions,
            rust_functions,
        ),
    ] {
        eprintln!("writing {count} variants of {name}");
        let (identical, code_bytes) = write_variants(&engine, base, &modules, &table, first, count)?;
        code_identical &= identical;
        groups.push((name, first, count, code_bytes as f64 / (1 << 20) as f64));
    }

    // As the operator starts a pool (code mapped from files in its cache directory), then,
    // in the same run, without a cache directory: every load a copy in the pool's memory,
    // the way all pools loaded code before.
    let mapped = measure_pool(settings, &table, &groups, Some(settings.work("pool-cache")), None)?;
    let copied = measure_pool(settings, &table, &groups, None, None)?;
    let stored = from_the_store(settings, &table, &groups, functions)?;
    Ok(Density {
        functions,
        code_identical,
        mapped,
        copied,
        stored,
    })
}

/// The node agent started with a store of its own; a pool process that puts every
/// Function's code there (its first requests read the code, as without a store); then a new
/// pool process, measured, whose first requests map the store's files.
fn from_the_store(
    settings: &Settings,
    table: &Path,
    groups: &[(&'static str, usize, usize, f64)],
    functions: usize,
) -> anyhow::Result<PoolRun> {
    // The runtime maps only what a root agent hands it, as on a node.
    if !rustix::process::geteuid().is_root() {
        bail!("the node's code store is measured as a node runs it, its agent as root: run the bench as root");
    }
    let dir = settings.work("code-store");
    let socket = dir.join("bench.sock");
    let objects = dir.join("store/objects");
    let _agent = Server::spawn(
        Command::new(settings.bin("wasmless-node-agent"))
            .arg("--store-dir")
            .arg(dir.join("store"))
            .arg("--socket")
            .arg(format!("bench={}", socket.display()))
            .args(["--store-budget", "64Gi", "--namespace-quota", "64Gi"])
            .env("RUST_LOG", "warn"),
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if Instant::now() > deadline {
            bail!("the node agent made no socket in 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stored = |objects: &Path| {
        std::fs::read_dir(objects).map_or(0, |entries| {
            entries
                .flatten()
                .filter(|entry| entry.file_name().to_string_lossy().ends_with(".meta"))
                .count()
        })
    };
    // A pool process puts one code at a time and skips a put while another is on its way
    // (the next process that misses the code puts it): new processes until the store holds
    // every Function's.
    for pass in 1..=20 {
        eprintln!(
            "filling the node's code store, pass {pass}: {} of {functions}",
            stored(&objects)
        );
        let filling = settings.work(&format!("pool-cache-filling-{pass}"));
        measure_pool(settings, table, groups, Some(filling), Some(&socket))?;
        std::thread::sleep(Duration::from_secs(1));
        if stored(&objects) >= functions {
            return measure_pool(
                settings,
                table,
                groups,
                Some(settings.work("pool-cache-stored")),
                Some(&socket),
            );
        }
    }
    bail!(
        "the store holds {} of {functions} Functions' code after 20 pools",
        stored(&objects)
    )
}

/// What one run of the pool saw: a row per group, its memory empty and with all loaded,
/// and how many Functions it said it held.
pub struct PoolRun {
    pub rows: Vec<DensityRow>,
    pub empty: Resident,
    pub all_loaded: Resident,
    pub loaded_reported: f64,
}

fn measure_pool(
    settings: &Settings,
    table: &Path,
    groups: &[(&'static str, usize, usize, f64)],
    cache: Option<std::path::PathBuf>,
    store: Option<&Path>,
) -> anyhow::Result<PoolRun> {
    let admin = wasmless_testkit::free_port();
    let mut command = Command::new(settings.bin("wasmless-runtime"));
    command
        .arg("--pool")
        .arg(table)
        .args(["--bind", "127.0.0.1", "--admin-port", &admin.to_string()])
        .args(["--pool-memory-budget", "64Gi", "--max-concurrency", "16"])
        .args(["--pool-mapped-code-budget", "64Gi"])
        // The first request of a Function not loaded is what is measured.
        .args(["--pool-load-ahead", "false"])
        .env("RUST_LOG", "warn");
    if let Some(cache) = &cache {
        command.arg("--cache-dir").arg(cache);
    }
    if let Some(store) = store {
        command.arg("--code-store").arg(store);
    }
    let mode = match (&cache, store) {
        (_, Some(_)) => "from the node's store",
        (Some(_), None) => "mapped",
        (None, None) => "copied",
    };
    let mut pool = Server::spawn(&mut command)?;
    wait_ready(admin, &mut pool)?;
    let empty = resident_mib(pool.pid());

    let mut rows = Vec::new();
    let mut before = empty;
    for &(name, first, count, code_mib) in groups {
        eprintln!("first requests ({mode}): {name}");
        let mut first_requests = Vec::with_capacity(count);
        for index in first..first + count {
            first_requests.push(timed_get(port(index))?);
        }
        let after = resident_mib(pool.pid());
        let mut loaded = Vec::with_capacity(count);
        for index in first..first + count {
            loaded.push(timed_get(port(index))?);
        }
        rows.push(DensityRow {
            name: format!("{name}, {mode}"),
            functions: count,
            rss_per_function_mib: (after.rss - before.rss) / count as f64,
            private_per_function_mib: (after.private - before.private) / count as f64,
            code_mib,
            first_request_p50_ms: percentile(&mut first_requests, 0.5),
            first_request_p90_ms: percentile(&mut first_requests, 0.9),
            loaded_p50_ms: percentile(&mut loaded, 0.5),
            loaded_p90_ms: percentile(&mut loaded, 0.9),
        });
        before = after;
    }
    let metrics = admin_get(admin, "/metrics")?;
    let loaded_reported = metrics
        .lines()
        .find_map(|line| line.strip_prefix("wasmless_pool_functions_loaded "))
        .and_then(|value| value.trim().parse().ok())
        .context("the pool exports no wasmless_pool_functions_loaded")?;
    Ok(PoolRun {
        rows,
        empty,
        all_loaded: before,
        loaded_reported,
    })
}

fn port(index: usize) -> u16 {
    FIRST_PORT + u16::try_from(index).expect("fewer Functions than ports")
}

/// `count` Functions from `base`: each the base module with a custom section naming it
/// (so each has a digest of its own, as distinct Functions do), and the base's native
/// code packaged for that digest. Custom sections are not compiled, so a variant's code
/// is the base's: checked here by compiling the first variant for real. Whether it was
/// equal, and the code's size.
fn write_variants(
    engine: &wasmtime::Engine,
    base: &Module,
    modules: &Path,
    table: &Path,
    first: usize,
    count: usize,
) -> anyhow::Result<(bool, usize)> {
    use wasmless_host::precompiled::{compile_native, package};
    let wasm = std::fs::read(&base.path)?;
    let abi = wasmless_host::abi::detect(&wasm)?;
    let cwasm = compile_native(engine, abi, &wasm).map_err(wasmtime_error)?;
    let mut identical = true;
    for index in first..first + count {
        let name = format!("fn-{index}");
        let variant = with_custom_section(&wasm, &name);
        let digest = Digest::of(&variant);
        if index == first {
            identical = compile_native(engine, abi, &variant).map_err(wasmtime_error)? == cwasm;
        }
        let code = package(engine, abi, &cwasm, digest, false);
        let module_path = modules.join(format!("{name}.wasm"));
        let code_path = modules.join(format!("{name}.cwasm.lz4"));
        std::fs::write(&module_path, &variant)?;
        std::fs::write(&code_path, &code)?;
        let args = [
            "--function".to_string(),
            name.clone(),
            "--module".into(),
            module_path.display().to_string(),
            "--module-digest".into(),
            digest.to_string(),
            "--code".into(),
            code_path.display().to_string(),
            "--code-digest".into(),
            Digest::of(&code).to_string(),
        ];
        let entry = serde_json::json!({ "port": port(index), "args": args });
        std::fs::write(table.join(format!("{name}.json")), entry.to_string())?;
    }
    Ok((identical, cwasm.len()))
}

fn wasmtime_error(error: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{error:#}")
}

pub(crate) fn with_custom_section(wasm: &[u8], name: &str) -> Vec<u8> {
    wasmless_artifact::guest_files::with_custom_section(wasm, name, &[])
}

fn wait_ready(admin: u16, pool: &mut Server) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if admin_get(admin, "/readyz").is_ok_and(|body| body.contains("ready")) {
            return Ok(());
        }
        if let Some(status) = pool.0.try_wait()? {
            bail!("the pool exited with {status}");
        }
        if Instant::now() > deadline {
            bail!("the pool was not ready within a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn admin_get(port: u16, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

/// One GET / on a new connection, as a client from another pod makes it: the time to
/// the whole response, which must be a 200.
fn timed_get(port: u16) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let elapsed = started.elapsed();
    if !response.starts_with(b"HTTP/1.1 200") {
        bail!(
            "port {port} answered {}",
            String::from_utf8_lossy(&response[..response.len().min(200)])
        );
    }
    Ok(elapsed)
}

pub(crate) fn percentile(times: &mut [Duration], at: f64) -> f64 {
    times.sort();
    let index = ((times.len() as f64 - 1.0) * at).round() as usize;
    times[index].as_secs_f64() * 1000.0
}

pub const HEADING: &str = "## Pool density: a thousand Functions in one process";

pub fn section(density: &Density) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{HEADING}\n");
    let _ = writeln!(
        md,
        "One `wasmless-runtime --pool` process serving {} distinct Functions, each on its own port with its own \
         module digest and compiled code (`--code`, as the builder makes it), loaded on its first request. Each \
         is the Rust hello or the Goless sample with a custom section naming it, so its digest is its own; custom \
         sections are not compiled, so its native code is its base's ({}). Requests are sequential GET / on a new \
         loopback connection, client and pool on the same 2 cores ({}).\n",
        density.functions,
        if density.code_identical {
            "checked in this run: the first variant compiled for real gives the same code byte for byte"
        } else {
            "NOT the same in this run: the first variant compiled for real gave different code"
        },
        crate::report::chrono_free_now()
    );
    let rows: Vec<&DensityRow> = density
        .mapped
        .rows
        .iter()
        .chain(&density.copied.rows)
        .chain(&density.stored.rows)
        .collect();
    md.push_str(&density_table(&rows));
    let _ = writeln!(
        md,
        "\n- the pool was run three times in this run: *mapped*, as the operator starts it (`--cache-dir`: the \
         builder's code written to a file there and mapped), and *copied*, without a cache directory (every load \
         a copy of the code in the pool's memory, as every pool loaded it before)"
    );
    let _ = writeln!(
        md,
        "- and a third time *from the node's store*: the node agent (`wasmless-node-agent`) beside, a pool process \
         that read every Function's code and put it there (not measured), then a new pool process, measured, \
         with `--code-store`: each first request asks the store and maps the file it hands over, reading, \
         verifying and writing nothing (docs/architecture.md, \"The node's code store\"); each file was checked \
         by the agent when it was put, so these first requests do not include the re-hash the first get after \
         an agent's restart makes (~6 ms for the Goless sample's code, once per file)"
    );
    for (mode, run) in [
        ("mapped", &density.mapped),
        ("copied", &density.copied),
        ("from the store", &density.stored),
    ] {
        let _ = writeln!(
            md,
            "- the pool's RSS, {mode}: {:.1} MiB with the table read and nothing loaded ({:.1} MiB of it private), \
             {:.1} MiB with all {} loaded ({:.1} MiB private; `wasmless_pool_functions_loaded` said {})",
            run.empty.rss,
            run.empty.private,
            run.all_loaded.rss,
            density.functions,
            run.all_loaded.private,
            run.loaded_reported
        );
    }
    let _ = writeln!(
        md,
        "- mapped (docs/architecture.md, \"Mapped code, and two budgets\"), the code column is not the pool's own \
         memory: a loaded Function's RSS is mostly the code file's pages its first \
         request touched (page cache, which the kernel can drop), and what it holds alone is the private column \
         (anonymous and shared memory: what wasmtime decodes from the code, the instance template). The file itself \
         stays in the page cache after it is written until the kernel reclaims it; one copy per Function per \
         process, since each pool process maps a file of its own. `--pool-memory-budget` counts the private part, \
         `--pool-mapped-code-budget` the files. Writing the file is what a first request from nothing pays for \
         it: compare the first-request column of the two."
    );
    let _ = writeln!(
        md,
        "\n`pool`: run alone with `bench/run.sh --only pool` (rewrites this section).\n"
    );
    md
}

/// The density table, one row per kind of Function: the process run's and the pool pod's.
pub(crate) fn density_table(rows: &[&DensityRow]) -> String {
    let mut md = String::from(
        "| Functions | count | native code of one | RSS per loaded Function | of it private | first request (not loaded) p50 / p90 | loaded p50 / p90 |\n|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} MiB | {:.2} MiB | {:.2} MiB | {:.2} / {:.2} ms | {:.2} / {:.2} ms |",
            row.name,
            row.functions,
            row.code_mib,
            row.rss_per_function_mib,
            row.private_per_function_mib,
            row.first_request_p50_ms,
            row.first_request_p90_ms,
            row.loaded_p50_ms,
            row.loaded_p90_ms
        );
    }
    md
}
