use clap::{Parser, Subcommand};
use std::path::PathBuf;
use wasmless_builder::command::{self, BuildArgs};

#[derive(Parser)]
#[command(
    name = "wasmless-builder",
    version,
    about = "Compile a Function's source to WebAssembly once, and publish it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build (or take from the cache), validate, write and optionally publish a module.
    Build(BuildArgs),
    /// Download the Rust SDK's dependencies, for builds with --vendor-dir and no network.
    Vendor {
        /// Directory to fill.
        dir: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Build(args) => {
            if !command::run(args, &|step| eprintln!("{step}...")).await {
                std::process::exit(1);
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
