//! `wasmless-runtime`: flags and environment in, `serve` until SIGTERM.

use clap::Parser;
use wasmless_runtime::{Config, run};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    raise_open_files_limit();
    run(config).await?;
    Ok(())
}

/// The soft limit on open files up to the hard one, as Go's runtime does at start: a pool
/// holds a listening socket per Function on every serving thread, and the usual soft
/// limit of 1024 would cap it at a few hundred Functions.
fn raise_open_files_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(error) = setrlimit(Resource::Nofile, limit) {
            tracing::debug!(%error, "cannot raise the open files limit");
        }
    }
}
