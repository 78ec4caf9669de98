//! `wasmless-builder`: the build Job's steps (`prepare-cache`, `build`, `publish`), a thin
//! front on the library.

use clap::Parser;
use wasmless_builder::command;
use wasmless_builder::flags::{Cli, Command};
use wasmless_builder::publish_step;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Warnings (a cache entry that failed its check, a cache that cannot be used) on
    // stderr, which is the Job's log.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .init();
    match Cli::parse().command {
        Command::Build(args) => {
            stop_on_sigterm(&args.termination_log)?;
            exit_with(command::run(*args, &|step| eprintln!("{step}...")).await)
        }
        Command::Publish(args) => {
            stop_on_sigterm(&args.termination_log)?;
            exit_with(publish_step::run(*args, &|step| eprintln!("{step}...")).await)
        }
        Command::PrepareCache { root, namespace } => {
            match wasmless_builder::cache::prepare_dirs(&root, &namespace) {
                Ok(dirs) => tracing::info!(?dirs, "the build cache's directories are ready"),
                Err(why) => {
                    tracing::warn!(root = %root.display(), "the build cache cannot be prepared, this build runs cold: {why}")
                }
            }
            Ok(())
        }
        Command::Vendor { dir } => {
            wasmless_builder::toolchain::vendor(&dir)?;
            eprintln!("vendored the Rust SDK's dependencies into {}", dir.display());
            Ok(())
        }
    }
}

/// A step's exit status as the process's: the operator's Job tells a source that does not
/// build (10) from a failure worth a retry by it.
fn exit_with(status: i32) -> anyhow::Result<()> {
    if status != 0 {
        std::process::exit(status);
    }
    Ok(())
}

/// A builder is its container's PID 1, which the kernel does not stop on SIGTERM by
/// default: without this, a builder past its Job's deadline (or a Job deleted) would go on
/// compiling through the grace period and could still publish. It stops at once instead;
/// ending PID 1 ends the compiler processes it started. On a thread of its own, because
/// the compilers run blocking on the runtime's threads.
fn stop_on_sigterm(termination_log: &std::path::Path) -> anyhow::Result<()> {
    let termination_log = termination_log.to_owned();
    let (registered, is_registered) = std::sync::mpsc::channel();
    std::thread::Builder::new().name("sigterm".into()).spawn(move || {
        let signals = tokio::runtime::Builder::new_current_thread().enable_io().build();
        let terminate = signals.and_then(|signals| {
            let terminate =
                signals.block_on(async { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) });
            terminate.map(|terminate| (signals, terminate))
        });
        let (signals, mut terminate) = match terminate {
            Ok(ok) => {
                let _ = registered.send(Ok(()));
                ok
            }
            Err(error) => return drop(registered.send(Err(error))),
        };
        signals.block_on(terminate.recv());
        let message = "stopped by SIGTERM before the build finished; nothing more is published";
        eprintln!("error: {message}");
        command::write_termination_log(&termination_log, message);
        std::process::exit(128 + 15);
    })?;
    // Registered before the build starts, so no SIGTERM can come unhandled.
    is_registered.recv()??;
    Ok(())
}
