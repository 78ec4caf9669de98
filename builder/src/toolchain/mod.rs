//! The compilers, each run in a scratch directory that holds a generated project
//! around the user's source.

mod go;
mod go_cache_seed;
mod go_overlay;
mod rust;

use crate::{BuildError, BuildOptions, Language, Source};
use std::process::Command;

/// Largest compiler message kept: what fits a Kubernetes termination message.
const MAX_MESSAGE_BYTES: usize = 4096;

pub use go_cache_seed::GO_CACHE_SEED_ENV;
pub use rust::vendor;

pub fn compile(source: &Source, options: &BuildOptions) -> Result<Vec<u8>, BuildError> {
    match source.language {
        Language::Go => go::build(source, options),
        Language::Rust => rust::build(source, options),
        Language::Wat => {
            let text = String::from_utf8_lossy(&source.files[0].bytes).into_owned();
            wat::parse_str(&text).map_err(|error| {
                let mut error = error;
                error.set_path(std::path::Path::new(&source.files[0].name));
                BuildError::Compile {
                    tool: "wat",
                    message: error.to_string(),
                }
            })
        }
        Language::Wasm => Ok(source.files[0].bytes.clone()),
    }
}

/// Runs a compiler; on failure returns its output through `trim`.
fn run_compiler(tool: &'static str, command: &mut Command, trim: impl Fn(&str) -> String) -> Result<(), BuildError> {
    let output = command.output().map_err(|error| {
        BuildError::Toolchain(format!(
            "cannot run {tool} ({error}): install it, or point WASMLESS_{} at it",
            tool.to_ascii_uppercase()
        ))
    })?;
    if output.status.success() {
        return Ok(());
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    Err(BuildError::Compile {
        tool,
        message: cut(&trim(&text)),
    })
}

fn cut(message: &str) -> String {
    let message = message.trim();
    if message.len() <= MAX_MESSAGE_BYTES {
        return message.to_string();
    }
    let mut end = MAX_MESSAGE_BYTES - 4;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n...", &message[..end])
}

fn tool(name: &str, env: &str) -> Command {
    Command::new(std::env::var_os(env).unwrap_or_else(|| name.into()))
}
