//! `wasmless`: the person's tool (`dev`, `build`, `serve`, `crd`, and `deploy`, `get`,
//! `logs` on a cluster).

mod cluster;
mod dev;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "wasmless", version, about = "Build and run HTTP functions as WebAssembly")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a function and serve it on localhost, rebuilding when its source changes.
    Dev(dev::DevArgs),
    /// Compile a handler to a validated module, and optionally publish it (wasmless-builder build).
    Build(Box<wasmless_builder::command::BuildArgs>),
    /// Serve a module (wasmless-runtime).
    Serve(Box<wasmless_runtime::Config>),
    /// Apply a Function to the current kubeconfig's cluster, follow its build, print its URL.
    Deploy(cluster::deploy::DeployArgs),
    /// List Functions, as `kubectl get fn` does.
    Get(cluster::get::GetArgs),
    /// Stream the request and handler log lines of a Function's pods.
    Logs(cluster::logs::LogsArgs),
    /// Where a Function's triggers are (lag, dead letters, last delivery), and its recent
    /// failed tries and dead letters.
    Events(cluster::events::EventsArgs),
    /// Send all of a Function's traffic to a kept revision, without a build (default: the
    /// revision before the one serving).
    Rollback(cluster::rollback::RollbackArgs),
    /// Print the Function CustomResourceDefinition (`wasmless crd | kubectl apply -f -`).
    Crd,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // A person reads this: the error and its causes on one line, never a backtrace (which
    // `anyhow` would print from `main` whenever RUST_BACKTRACE is set).
    match run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Dev(args) => {
            init_readable_logs();
            dev::run(args).await
        }
        Command::Build(args) => {
            let status = wasmless_builder::command::run(*args, &|step| eprintln!("{step}...")).await;
            if status != 0 {
                std::process::exit(status);
            }
            Ok(())
        }
        Command::Deploy(args) => cluster::deploy::run(args).await,
        Command::Get(args) => cluster::get::run(args).await,
        Command::Logs(args) => cluster::logs::run(args).await,
        Command::Events(args) => cluster::events::run(args).await,
        Command::Rollback(args) => cluster::rollback::run(args).await,
        Command::Crd => {
            print!("{}", wasmless_operator::crd_yaml());
            Ok(())
        }
        Command::Serve(config) => {
            wasmless_runtime::run(*config).await?;
            Ok(())
        }
    }
}

/// `dev` is read by a person: compact lines rather than JSON.
fn init_readable_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .compact()
        .with_target(false)
        .with_ansi(ansi)
        .with_env_filter(filter)
        .init();
}

#[cfg(test)]
mod flags_reference_test {
    use clap::CommandFactory;

    #[test]
    fn flags_reference() {
        let page = wasmless_testkit::flags_reference::page(
            super::Cli::command(),
            "The `wasmless` command and each of its sub-commands: `dev` on this machine, `deploy`, `get`, `logs`, `events` and `rollback` on the current kubeconfig's cluster (`docs/guide.md`).",
        );
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
        wasmless_testkit::flags_reference::check(root, "docs/reference/wasmless.md", &page);
    }
}
