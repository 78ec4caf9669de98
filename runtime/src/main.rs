//! `wasmless-runtime`: flags and environment in, `serve` until SIGTERM.

use clap::Parser;
use wasmless_runtime::{Config, logging, serve, shutdown_signal};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _logs = logging::init();
    let config = Config::parse();
    serve(config, shutdown_signal(), |_| {}).await?;
    Ok(())
}
