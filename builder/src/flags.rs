//! The builder's flags: the build Job's steps as sub-commands, as `wasmless-builder --help`
//! lists them and `docs/reference/wasmless-builder.md` shows them.

use crate::command::BuildArgs;
use crate::publish_step::PublishArgs;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "wasmless-builder",
    version,
    about = "Compile a Function's source to WebAssembly once, and publish it"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Build (or take from the cache), validate, write and optionally publish a module.
    Build(Box<BuildArgs>),
    /// A build Job's last step: validate the module the compile step wrote, compile it to
    /// native code and publish both, with the token the compile step never had.
    Publish(Box<PublishArgs>),
    /// A build Job's first step: make the namespace's compile directory and the publish
    /// steps' under the persistent cache's root, private to the builder. Never fails.
    PrepareCache {
        /// The persistent cache's root (the node's directory, or the claim).
        #[arg(long)]
        root: PathBuf,
        /// The build's namespace.
        #[arg(long)]
        namespace: String,
    },
    /// Download the Rust SDK's dependencies, for builds with --vendor-dir and no network.
    Vendor {
        /// Directory to fill.
        dir: PathBuf,
    },
}
