//! The benchmark suite: one run measures Wasmless against compile-at-startup (Goless),
//! `wasmtime serve` and native servers, side by side, and writes docs/benchmarks.md
//! with a table, a plot and the machine it ran on. Ratios taken in the same run are
//! what count; absolute numbers drift on a shared 2-core machine.
//!
//! Run it with `bench/run.sh [--quick]`, which installs wrk and wasmtime-cli and builds
//! everything in release mode first.

mod measure;
mod pool;
mod pool_pod;
mod report;
mod scenarios;
mod streaming;
mod traces;

use clap::Parser;
use std::path::PathBuf;

#[derive(Parser)]
struct Args {
    /// Shorter load runs and fewer repetitions (under 3 minutes).
    #[arg(long)]
    quick: bool,
    /// The workspace root.
    #[arg(long, default_value = ".")]
    root: PathBuf,
    /// Directory of the release binaries.
    #[arg(long)]
    bin_dir: PathBuf,
    /// `wasmtime` 48.x, for the `wasmtime serve` row; skipped when absent.
    #[arg(long)]
    wasmtime: Option<PathBuf>,
    /// Where to write the report.
    #[arg(long, default_value = "docs/benchmarks.md")]
    output: PathBuf,
    /// Run one comparison and rewrite only its section of the report (`outbound`, `pool`,
    /// `streaming`, `traces`; on the test cluster `pool-pod`, as `bench/cluster.sh density` runs it,
    /// and `pool-defaults`, as `bench/cluster.sh defaults` does).
    #[arg(long, value_parser = ["outbound", "pool", "pool-pod", "pool-defaults", "streaming", "traces"])]
    only: Option<String>,
    /// Functions in the pool's density run.
    #[arg(long, default_value_t = 1000)]
    pool_functions: usize,
    /// How many of them are the Goless sample (the rest the Rust hello).
    #[arg(long, default_value_t = 100)]
    pool_go_functions: usize,
    /// The pool pod's density run publishes its builds to this OCI registry (`host:port`,
    /// plain HTTP) and its Functions say `storage: oci`, instead of ConfigMaps: a thousand Go
    /// Functions' code is more than the test cluster's etcd holds.
    #[arg(long)]
    pool_registry: Option<String>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let settings = scenarios::Settings::new(args.root, args.bin_dir, args.wasmtime, args.quick)?;
    match args.only.as_deref() {
        Some("outbound") => {
            let outbound = scenarios::run_outbound(&settings)?;
            report::write_outbound_section(&args.output, &settings, &outbound)?;
            eprintln!("rewrote the outbound section of {}", args.output.display());
            return Ok(());
        }
        Some("pool") => {
            let density = pool::density(&settings, args.pool_functions, args.pool_go_functions)?;
            report::write_section(&args.output, pool::HEADING, &pool::section(&density))?;
            eprintln!("rewrote the pool section of {}", args.output.display());
            return Ok(());
        }
        Some("pool-pod") => {
            let density = pool_pod::run(
                &settings,
                args.pool_functions,
                args.pool_go_functions,
                args.pool_registry.as_deref(),
            )?;
            report::write_section(&args.output, pool_pod::HEADING, &pool_pod::section(&density))?;
            eprintln!("rewrote the pool pod section of {}", args.output.display());
            return Ok(());
        }
        Some("pool-defaults") => {
            let run = pool_pod::defaults::run(&settings, args.pool_go_functions)?;
            report::write_section(
                &args.output,
                pool_pod::defaults::HEADING,
                &pool_pod::defaults::section(&run),
            )?;
            eprintln!(
                "rewrote the section at the operator's defaults of {}",
                args.output.display()
            );
            return Ok(());
        }
        Some("streaming") => {
            let rows = streaming::run(&settings)?;
            report::write_section(&args.output, streaming::HEADING, &streaming::section(&rows))?;
            eprintln!("rewrote the streaming section of {}", args.output.display());
            return Ok(());
        }
        Some("traces") => {
            let rows = traces::run(&settings)?;
            report::write_section(&args.output, traces::HEADING, &traces::section(&settings, &rows))?;
            eprintln!("rewrote the traces section of {}", args.output.display());
            return Ok(());
        }
        _ => {}
    }
    let results = scenarios::run_all(&settings)?;
    report::write(&args.output, &settings, &results)?;
    eprintln!("wrote {}", args.output.display());
    Ok(())
}
