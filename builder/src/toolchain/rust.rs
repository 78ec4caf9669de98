//! Rust: the user's source as the library of a generated crate that depends on the
//! Rust SDK, built with `cargo build --release --target wasm32-wasip2`. The SDK is
//! embedded in this binary; with a vendor directory the build needs no network.
//!
//! A handler with its own `Cargo.toml` lists its dependencies there: the builder keeps its
//! package's name and version (so a `Cargo.lock` made beside it matches, and then the build
//! is `--locked`), its edition, features and dependencies, and writes the rest itself — the
//! library's name and crate type, the SDK as a path dependency, the profile, no build script,
//! no workspace ([`manifest`]). Dependencies come only from the crates registry that
//! [`crate::CARGO_REGISTRY_ENV`] names, set as crates.io's replacement in a `CARGO_HOME` the
//! builder writes in its cache directory, where downloaded crates are kept across builds;
//! cargo checks each `.crate` against the index's checksum (and the lock's).

use super::{run_compiler, tool};
use crate::{BuildError, BuildOptions, Source};
use std::path::Path;
use wasmless_formats::cargo_manifest::handler_manifest;

const SDK_FILES: [(&str, &str); 6] = [
    ("Cargo.toml", include_str!("../../../sdk/rust/Cargo.toml")),
    ("src/lib.rs", include_str!("../../../sdk/rust/src/lib.rs")),
    ("src/guest.rs", include_str!("../../../sdk/rust/src/guest.rs")),
    ("src/outbound.rs", include_str!("../../../sdk/rust/src/outbound.rs")),
    ("src/query.rs", include_str!("../../../sdk/rust/src/query.rs")),
    ("src/stream.rs", include_str!("../../../sdk/rust/src/stream.rs")),
];

const CRATE_NAME: &str = "wasmless_handler";

const CARGO_TOML: &str = r#"[package]
name = "wasmless-handler"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
wasmless-sdk = { path = "wasmless-sdk" }

[profile.release]
opt-level = "s"
strip = true

[workspace]
"#;

/// The generated crate's manifest, and the crates it needs from a registry.
struct Manifest {
    text: String,
    /// `name requirement` of each dependency beside the SDK; empty: none.
    crates: Vec<String>,
}

pub fn build(source: &Source, options: &BuildOptions) -> Result<Vec<u8>, BuildError> {
    let manifest = manifest(source)?;
    let registry = match (&options.cargo_registry, manifest.crates.is_empty()) {
        (_, true) => None,
        (Some(registry), false) => Some(sparse_index(registry)?),
        (None, false) => {
            return Err(BuildError::NoCratesRegistry {
                crates: manifest.crates.join(", "),
            });
        }
    };
    let scratch =
        tempfile::tempdir().map_err(|e| BuildError::Toolchain(format!("cannot make a build directory: {e}")))?;
    let project = scratch.path();
    // A registry replaces crates.io for every crate, the SDK's dependencies too: cargo takes
    // one replacement per source, so the vendor directory is not used then.
    let vendor_dir = options.vendor_dir.as_deref().filter(|_| registry.is_none());
    write_crate(project, Some(source), &manifest.text, vendor_dir)
        .map_err(|e| BuildError::Toolchain(format!("cannot write the Rust crate: {e}")))?;
    // One target directory for every build, so the SDK's dependencies compile once.
    let target_dir = options.cache_dir.join("rust-target");
    let mut command = tool("cargo", "WASMLESS_CARGO");
    command
        .current_dir(project)
        .args([
            "build",
            "--release",
            "--quiet",
            "--message-format",
            "short",
            "--target",
            "wasm32-wasip2",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS");
    if vendor_dir.is_some() {
        command.arg("--offline");
    }
    if let Some(lock) = source.module_file("Cargo.lock") {
        std::fs::write(project.join("Cargo.lock"), &lock.bytes)
            .map_err(|e| BuildError::Toolchain(format!("cannot write the Rust crate: {e}")))?;
        command.arg("--locked");
    }
    if let Some(registry) = &registry {
        let cargo_home = options.cache_dir.join("cargo-home");
        write_cargo_home(&cargo_home, registry)
            .map_err(|e| BuildError::Toolchain(format!("cannot write {}: {e}", cargo_home.display())))?;
        // The builder image is offline for the vendored builds; these ones download.
        command.env("CARGO_HOME", &cargo_home).env("CARGO_NET_OFFLINE", "false");
    } else if options.compiler_caches_in_cache_dir {
        // Downloads and their index, kept with the build cache (a persistent one in a Job).
        command.env("CARGO_HOME", options.cache_dir.join("cargo-home"));
    }
    let names: Vec<String> = source.files.iter().map(|f| f.name.clone()).collect();
    match run_compiler("cargo", &mut command, |text| trim_cargo_output(text, &names)) {
        Err(BuildError::Compile { message, .. }) if registry.is_some() && registry_failed(&message) => {
            return Err(BuildError::CratesRegistry(message));
        }
        Err(BuildError::Compile { message, tool }) => {
            return Err(BuildError::Compile {
                tool,
                message: with_hint(message),
            });
        }
        other => other?,
    }
    let module = target_dir.join(format!("wasm32-wasip2/release/{CRATE_NAME}.wasm"));
    std::fs::read(&module)
        .map_err(|e| BuildError::Toolchain(format!("cargo wrote no module at {}: {e}", module.display())))
}

/// The configured registry as cargo names a sparse index: `sparse+http(s)://…/`. A plain
/// `http(s)://` URL is taken as one; anything else is a setting to fix, not a source.
fn sparse_index(registry: &str) -> Result<String, BuildError> {
    let registry = registry.trim();
    let url = if registry.starts_with("http://") || registry.starts_with("https://") {
        format!("sparse+{registry}")
    } else {
        registry.to_string()
    };
    // Written into a TOML string below: nothing that could end it.
    let plain = url.bytes().all(|b| b.is_ascii_graphic() && !b"\"'\\".contains(&b));
    if !plain || !(url.starts_with("sparse+http://") || url.starts_with("sparse+https://")) {
        return Err(BuildError::Toolchain(format!(
            "{} is {registry:?}, not a sparse index URL: write sparse+https://host/path/ (the URL of the index's config.json, without it)",
            crate::CARGO_REGISTRY_ENV
        )));
    }
    Ok(if url.ends_with('/') { url } else { format!("{url}/") })
}

/// The `CARGO_HOME` of builds through a registry: its configuration ([`cargo_config`]) and
/// its `registry/`, which keeps the index and the downloaded crates for the next build.
fn write_cargo_home(cargo_home: &Path, registry: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(cargo_home)?;
    let config = cargo_config(registry);
    let path = cargo_home.join("config.toml");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(config.as_str()) {
        std::fs::write(path, config)?;
    }
    Ok(())
}

/// crates.io's own sparse index, which cargo refuses as a replacement of itself.
const CRATES_IO_INDEX: &str = "sparse+https://index.crates.io/";

/// Cargo's configuration replacing crates.io with `registry`, and nothing else: no user or
/// machine configuration applies in a `CARGO_HOME` of the builder's.
fn cargo_config(registry: &str) -> String {
    if registry == CRATES_IO_INDEX {
        return "# Written by wasmless-builder: crates come from crates.io, as configured.\n".into();
    }
    format!(
        "# Written by wasmless-builder: every crate comes from the configured registry.\n\
         [source.crates-io]\nreplace-with = \"wasmless-registry\"\n\n\
         [source.wasmless-registry]\nregistry = {registry:?}\n"
    )
}

/// Whether cargo's output says the registry could not be reached or failed, rather than
/// that the source is wrong (a crate or version it does not have, a lock that does not match).
fn registry_failed(message: &str) -> bool {
    [
        "Couldn't connect to server",
        "Couldn't resolve host",
        "Connection refused",
        "Timeout was reached",
        "spurious network error",
        "failed to get successful HTTP response",
        "failed to download from",
        "failed to verify the checksum of",
    ]
    .iter()
    .any(|sign| message.contains(sign))
}

/// Cargo's message, with what to do where cargo's own words assume a local project.
fn with_hint(message: String) -> String {
    let hint = if message.contains("--locked was passed") || message.contains("cannot update the lock file") {
        "\nhint: Cargo.lock does not match the crate the builder makes of Cargo.toml (your package, \
         its dependencies and wasmless-sdk 0.1.0 by path): make it with `cargo generate-lockfile` \
         beside a Cargo.toml that lists wasmless-sdk by path, or leave Cargo.lock out"
    } else if message.contains("failed to run custom build command") {
        "\nhint: a dependency's build script failed; crates that compile C code (the `cc` crate, \
         `-sys` crates) cannot be built for wasm32-wasip2 here: use a pure-Rust crate instead"
    } else {
        ""
    };
    format!("{message}{hint}")
}

/// The manifest of the generated crate: the builder's own without a Cargo.toml, else the
/// user's combined with it (`wasmless_formats::cargo_manifest`). A setting that cannot work
/// here is refused with the reason, as the source's fault.
fn manifest(source: &Source) -> Result<Manifest, BuildError> {
    let Some(file) = source.module_file("Cargo.toml") else {
        return Ok(Manifest {
            text: CARGO_TOML.to_string(),
            crates: Vec::new(),
        });
    };
    let made = handler_manifest(&String::from_utf8_lossy(&file.bytes), CARGO_TOML, CRATE_NAME).map_err(|why| {
        BuildError::Compile {
            tool: "cargo",
            message: format!("Cargo.toml: {why}"),
        }
    })?;
    Ok(Manifest {
        text: made.text,
        crates: made.crates,
    })
}

/// Writes the generated crate. Without a source it is the SDK's dependencies alone,
/// which is what [`vendor`] needs.
fn write_crate(
    project: &Path,
    source: Option<&Source>,
    manifest: &str,
    vendor_dir: Option<&Path>,
) -> std::io::Result<()> {
    for (name, text) in SDK_FILES {
        let path = project.join("wasmless-sdk").join(name);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(path, text)?;
    }
    std::fs::write(project.join("Cargo.toml"), manifest)?;
    let handler_dir = project.join("src/handler");
    std::fs::create_dir_all(&handler_dir)?;
    let mut lib = String::from("// Generated by wasmless-builder around the handler's source.\nmod handler;\n");
    match source {
        Some(source) => {
            let exports_itself = source
                .files
                .iter()
                .any(|f| String::from_utf8_lossy(&f.bytes).contains("export!"));
            let entry = entry_file(source);
            for file in &source.files {
                let name = if file.name == entry {
                    "mod.rs"
                } else {
                    file.name.as_str()
                };
                std::fs::write(handler_dir.join(name), &file.bytes)?;
            }
            if !exports_itself {
                lib.push_str("wasmless_sdk::export!(handler::handler);\n");
            }
        }
        None => std::fs::write(handler_dir.join("mod.rs"), "")?,
    }
    std::fs::write(project.join("src/lib.rs"), lib)?;
    if let Some(vendor_dir) = vendor_dir {
        std::fs::create_dir_all(project.join(".cargo"))?;
        std::fs::write(
            project.join(".cargo/config.toml"),
            format!(
                "[source.crates-io]\nreplace-with = \"vendored-sources\"\n\n[source.vendored-sources]\ndirectory = {:?}\n",
                vendor_dir.display().to_string()
            ),
        )?;
    }
    Ok(())
}

/// The file that becomes the handler module: the only one, or `handler.rs`/`lib.rs`.
fn entry_file(source: &Source) -> String {
    if let [single] = source.files.as_slice() {
        return single.name.clone();
    }
    ["handler.rs", "lib.rs", "mod.rs"]
        .into_iter()
        .find(|name| source.files.iter().any(|f| f.name == *name))
        .unwrap_or(&source.files[0].name)
        .to_string()
}

/// `--message-format short` already gives one line per diagnostic; drop cargo's
/// summary and name the user's files as the user named them.
fn trim_cargo_output(text: &str, names: &[String]) -> String {
    let entry = names.first().cloned().unwrap_or_default();
    text.lines()
        .filter(|line| !line.trim().is_empty() && !line.starts_with("error: could not compile"))
        .filter(|line| !line.starts_with("warning: ") || line.contains(".rs:"))
        .map(|line| {
            let line = line.replace("src/handler/mod.rs", &entry);
            line.replace("src/handler/", "")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Downloads the SDK's dependencies into `dir` (`cargo vendor`), so later builds can
/// run with `--vendor-dir dir` and no network, as a build Job in a cluster must.
pub fn vendor(dir: &Path) -> Result<(), BuildError> {
    let scratch =
        tempfile::tempdir().map_err(|e| BuildError::Toolchain(format!("cannot make a build directory: {e}")))?;
    write_crate(scratch.path(), None, CARGO_TOML, None)
        .map_err(|e| BuildError::Toolchain(format!("cannot write the Rust crate: {e}")))?;
    let mut command = tool("cargo", "WASMLESS_CARGO");
    command
        .current_dir(scratch.path())
        .args(["vendor", "--quiet", "--versioned-dirs"])
        .arg(dir);
    run_compiler("cargo", &mut command, str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of the SDK left out of the builder's copy fails every Rust build, with a
    /// `file not found for module` in the SDK's own code.
    #[test]
    fn the_builder_carries_every_file_of_the_sdk() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk/rust/src");
        let mut on_disk: Vec<String> = std::fs::read_dir(src)
            .unwrap()
            .map(|entry| format!("src/{}", entry.unwrap().file_name().into_string().unwrap()))
            .chain(["Cargo.toml".to_string()])
            .collect();
        on_disk.sort();
        let mut carried: Vec<String> = SDK_FILES.iter().map(|(name, _)| name.to_string()).collect();
        carried.sort();
        assert_eq!(carried, on_disk);
    }

    #[test]
    fn the_registry_setting_is_a_sparse_index() {
        assert_eq!(
            sparse_index("https://crates.example.com/index").unwrap(),
            "sparse+https://crates.example.com/index/"
        );
        assert_eq!(
            sparse_index("sparse+http://10.0.0.1:8080/index/").unwrap(),
            "sparse+http://10.0.0.1:8080/index/"
        );
        for bad in ["git://x", "sparse+http://x/\"\n[source]", "crates.example.com"] {
            let error = sparse_index(bad).unwrap_err().to_string();
            assert!(
                error.contains("WASMLESS_CARGO_REGISTRY") && error.contains("sparse+https://"),
                "{error}"
            );
        }
    }

    #[test]
    fn crates_io_itself_is_no_replacement() {
        let mirror = cargo_config("sparse+http://10.0.0.1:8080/index/");
        assert!(
            mirror.contains("replace-with = \"wasmless-registry\"")
                && mirror.contains("registry = \"sparse+http://10.0.0.1:8080/index/\""),
            "{mirror}"
        );
        let itself = cargo_config(&sparse_index("https://index.crates.io").unwrap());
        assert!(
            !itself.contains("replace-with"),
            "cargo refuses crates.io replacing itself: {itself}"
        );
    }
}
