//! `cache_probe::probe!()` expands to a string: what this macro saw and wrote, as it ran
//! inside rustc. It writes `planted-by-cache-probe` into every directory it can, starting
//! from the places a build tells it of (rustc's `--out-dir` and `-L` paths, `CARGO_HOME`,
//! the working directory, their parents) and the node paths a build cache is known to live
//! under, then into every directory below the build cache it found. No dependency: the
//! registry it is published in holds only what the tests need.

use proc_macro::TokenStream;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

const MARKER: &str = "planted-by-cache-probe";
/// Directories planted below the build cache, at most: enough to reach every one of a
/// Function's build cache, few enough to keep the build quick.
const MOST_PLANTED: usize = 5_000;

#[proc_macro]
pub fn probe(_input: TokenStream) -> TokenStream {
    let report = run().join("\n");
    // A String's Debug form is a valid Rust string literal.
    format!("{report:?}").parse().expect("a string literal")
}

fn run() -> Vec<String> {
    let mut lines = Vec::new();
    let mut places = BTreeSet::new();
    for path in told_paths() {
        places.extend(path.ancestors().map(Path::to_path_buf));
    }
    for known in [
        "/var/lib/wasmless",
        "/var/lib/wasmless/builds",
        "/var/lib/wasmless/builds/namespaces",
        "/var/lib/wasmless/build-cache",
        "/cache",
        "/work",
        "/publish-tmp",
        "/tmp",
    ] {
        places.insert(PathBuf::from(known));
    }
    for place in &places {
        if let Ok(entries) = fs::read_dir(place) {
            let mut names: Vec<String> = entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names.truncate(40);
            lines.push(format!("saw {}: {}", place.display(), names.join(" ")));
        }
        lines.push(plant(place));
    }
    // The build cache: the directory that holds the target directory rustc writes into.
    let caches: BTreeSet<PathBuf> = told_paths()
        .iter()
        .filter_map(|path| path.ancestors().find(|a| a.ends_with("rust-target")))
        .filter_map(|target| target.parent().map(Path::to_path_buf))
        .collect();
    for cache in caches {
        let mut planted = 0;
        let mut pending = vec![cache.clone()];
        while let Some(dir) = pending.pop() {
            if planted >= MOST_PLANTED {
                break;
            }
            if fs::write(dir.join(MARKER), "a build-time macro wrote this\n").is_ok() {
                planted += 1;
            }
            if let Ok(entries) = fs::read_dir(&dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                        pending.push(entry.path());
                    }
                }
            }
        }
        lines.push(format!("planted {planted} directories below the build cache {}", cache.display()));
    }
    lines
}

/// The paths the build hands the compiler: where it writes, where it reads, where it runs.
fn told_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    let arguments: Vec<String> = std::env::args().collect();
    for pair in arguments.windows(2) {
        match pair[0].as_str() {
            "--out-dir" => paths.push(PathBuf::from(&pair[1])),
            "-L" => paths.push(PathBuf::from(pair[1].split_once('=').map_or(pair[1].as_str(), |(_, p)| p))),
            _ => {}
        }
    }
    for variable in ["CARGO_HOME", "CARGO_TARGET_DIR", "OUT_DIR", "HOME", "TMPDIR"] {
        if let Some(value) = std::env::var_os(variable) {
            paths.push(PathBuf::from(value));
        }
    }
    paths.extend(std::env::current_dir().ok());
    paths
}

fn plant(dir: &Path) -> String {
    match fs::write(dir.join(MARKER), "a build-time macro wrote this\n") {
        Ok(()) => format!("wrote {}", dir.join(MARKER).display()),
        Err(error) => format!("could not write {}: {}", dir.display(), error.kind()),
    }
}
