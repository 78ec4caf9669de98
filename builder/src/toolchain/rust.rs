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

const SDK_FILES: [(&str, &str); 5] = [
    ("Cargo.toml", include_str!("../../../sdk/rust/Cargo.toml")),
    ("src/lib.rs", include_str!("../../../sdk/rust/src/lib.rs")),
    ("src/guest.rs", include_str!("../../../sdk/rust/src/guest.rs")),
    ("src/outbound.rs", include_str!("../../../sdk/rust/src/outbound.rs")),
    ("src/query.rs", include_str!("../../../sdk/rust/src/query.rs")),
];

const CRATE_NAME: &str = "wasmless_handler";
const SDK_NAME: &str = "wasmless-sdk";

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

/// The `CARGO_HOME` of builds through a registry: its configuration replaces crates.io
/// with `registry` and nothing else; its `registry/` keeps the index and the downloaded
/// crates for the next build.
fn write_cargo_home(cargo_home: &Path, registry: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(cargo_home)?;
    let config = format!(
        "# Written by wasmless-builder: every crate comes from the configured registry.\n\
         [source.crates-io]\nreplace-with = \"wasmless-registry\"\n\n\
         [source.wasmless-registry]\nregistry = {registry:?}\n"
    );
    let path = cargo_home.join("config.toml");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(config.as_str()) {
        std::fs::write(path, config)?;
    }
    Ok(())
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

/// The manifest of the generated crate: the builder's own without a Cargo.toml, else what
/// the user's keeps (see the module's comment) around the builder's settings. A setting
/// that cannot work here is refused with the reason, as the source's fault.
fn manifest(source: &Source) -> Result<Manifest, BuildError> {
    let Some(file) = source.module_file("Cargo.toml") else {
        return Ok(Manifest {
            text: CARGO_TOML.to_string(),
            crates: Vec::new(),
        });
    };
    let refuse = |why: String| BuildError::Compile {
        tool: "cargo",
        message: format!("Cargo.toml: {why}"),
    };
    let text = String::from_utf8_lossy(&file.bytes);
    let user: toml::Table = text.parse().map_err(|e: toml::de::Error| refuse(e.to_string()))?;
    for key in ["patch", "replace"] {
        if user.contains_key(key) {
            return Err(refuse(format!(
                "[{key}] is not supported: dependencies come from the configured crates registry as published; depend on a published version instead"
            )));
        }
    }
    let empty = toml::Table::new();
    let package = match user.get("package") {
        Some(toml::Value::Table(package)) => package,
        None => &empty,
        Some(_) => return Err(refuse("`package` is not a table".into())),
    };
    if let Some((key, _)) = package.iter().find(|(_, v)| inherits(v)) {
        return Err(refuse(format!(
            "package.{key} is inherited from a workspace: the handler is built alone, so write the value out"
        )));
    }
    if package.get("build").is_some_and(|b| b.as_bool() != Some(false)) {
        return Err(refuse(
            "package.build: build scripts are not supported (the handler is built for wasm32-wasip2 with no native code); remove it".into(),
        ));
    }
    if package.contains_key("links") {
        return Err(refuse(
            "package.links: a handler cannot link a native library (it is built for wasm32-wasip2); remove it".into(),
        ));
    }
    if user
        .get("lib")
        .and_then(|lib| lib.get("proc-macro").or_else(|| lib.get("proc_macro")))
        .and_then(toml::Value::as_bool)
        == Some(true)
    {
        return Err(refuse(
            "lib.proc-macro: a handler is the library the runtime calls, not a procedural macro; depend on proc-macro crates instead".into(),
        ));
    }

    let mut crates = Vec::new();
    let mut out_package = toml::Table::new();
    let keep = |key: &str, default: &str| {
        package
            .get(key)
            .cloned()
            .unwrap_or_else(|| toml::Value::String(default.into()))
    };
    out_package.insert("name".into(), keep("name", "wasmless-handler"));
    out_package.insert("version".into(), keep("version", "0.1.0"));
    out_package.insert("edition".into(), keep("edition", "2024"));
    if let Some(rust_version) = package.get("rust-version") {
        out_package.insert("rust-version".into(), rust_version.clone());
    }
    out_package.insert("publish".into(), false.into());
    // Only the library is built: the user's files are its modules, nothing is discovered.
    out_package.insert("build".into(), false.into());
    for auto in ["autobins", "autoexamples", "autotests", "autobenches"] {
        out_package.insert(auto.into(), false.into());
    }

    let mut normal = dependencies(user.get("dependencies"), &mut crates).map_err(&refuse)?;
    normal.insert(
        SDK_NAME.into(),
        toml::Value::Table(toml::Table::from_iter([("path".to_string(), "wasmless-sdk".into())])),
    );
    let mut targets = toml::Table::new();
    if let Some(user_targets) = user.get("target").and_then(toml::Value::as_table) {
        for (cfg, tables) in user_targets {
            let deps = dependencies(tables.get("dependencies"), &mut crates)
                .map_err(|why| refuse(format!("target.{cfg}: {why}")))?;
            if !deps.is_empty() {
                let table = toml::Table::from_iter([("dependencies".to_string(), toml::Value::Table(deps))]);
                targets.insert(cfg.clone(), toml::Value::Table(table));
            }
        }
    }

    let mut out = toml::Table::new();
    out.insert("package".into(), toml::Value::Table(out_package));
    let lib = [
        ("name", toml::Value::from(CRATE_NAME)),
        ("path", "src/lib.rs".into()),
        ("crate-type", toml::Value::Array(vec!["cdylib".into()])),
    ];
    out.insert(
        "lib".into(),
        toml::Value::Table(lib.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
    );
    out.insert("dependencies".into(), toml::Value::Table(normal));
    if !targets.is_empty() {
        out.insert("target".into(), toml::Value::Table(targets));
    }
    if let Some(features) = user.get("features") {
        out.insert("features".into(), features.clone());
    }
    let builder_rest: toml::Table = CARGO_TOML
        .parse()
        .map_err(|e| BuildError::Toolchain(format!("the builder's own Cargo.toml: {e}")))?;
    for key in ["profile", "workspace"] {
        out.insert(key.into(), builder_rest[key].clone());
    }
    let text = toml::to_string(&out).map_err(|e| BuildError::Toolchain(format!("cannot write Cargo.toml: {e}")))?;
    Ok(Manifest {
        text: format!("# Generated by wasmless-builder from the handler's Cargo.toml.\n{text}"),
        crates,
    })
}

/// Whether a manifest value is `{ workspace = true }` (also written `key.workspace = true`).
fn inherits(value: &toml::Value) -> bool {
    value.get("workspace").is_some()
}

/// The registry dependencies of a `[dependencies]` table, the SDK left out (the builder adds
/// its own); appends `name requirement` of each to `crates`. A dependency that is not a
/// crate from the registry is refused.
fn dependencies(table: Option<&toml::Value>, crates: &mut Vec<String>) -> Result<toml::Table, String> {
    let mut out = toml::Table::new();
    let Some(table) = table else { return Ok(out) };
    let table = table.as_table().ok_or("`dependencies` is not a table")?;
    for (name, spec) in table {
        let package = spec.get("package").and_then(toml::Value::as_str).unwrap_or(name);
        if package == SDK_NAME {
            continue;
        }
        let requirement = match spec {
            toml::Value::String(version) => version.clone(),
            toml::Value::Table(spec) => {
                if inherits(&toml::Value::Table(spec.clone())) {
                    return Err(format!(
                        "dependency {name} is inherited from a workspace: the handler is built alone, so write its version out"
                    ));
                }
                for (key, what) in [
                    ("path", "a directory"),
                    ("git", "a git repository"),
                    ("registry", "another registry"),
                    ("registry-index", "another registry"),
                ] {
                    if spec.contains_key(key) {
                        return Err(format!(
                            "dependency {name} comes from {what}: only crates from the configured crates registry are built; depend on a published version, or put the code in the handler's files"
                        ));
                    }
                }
                spec.get("version")
                    .and_then(toml::Value::as_str)
                    .unwrap_or("*")
                    .to_string()
            }
            _ => return Err(format!("dependency {name} is neither a version nor a table")),
        };
        crates.push(format!("{package} {requirement}"));
        out.insert(name.clone(), spec.clone());
    }
    Ok(out)
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
    use crate::Language;
    use wasmless_formats::source::SourceFile;

    fn with_manifest(text: &str) -> Source {
        Source::from_files(
            Language::Rust,
            vec![
                SourceFile {
                    name: "lib.rs".into(),
                    bytes: b"pub fn handler(r: Request) -> Response { r }".to_vec(),
                },
                SourceFile {
                    name: "Cargo.toml".into(),
                    bytes: text.into(),
                },
            ],
        )
    }

    fn refusal(text: &str) -> String {
        match manifest(&with_manifest(text)) {
            Err(BuildError::Compile { message, .. }) => message,
            Err(other) => panic!("not the source's fault: {other}"),
            Ok(made) => panic!("accepted:\n{}", made.text),
        }
    }

    #[test]
    fn the_users_dependencies_go_into_the_builders_crate() {
        let made = manifest(&with_manifest(
            r#"
[package]
name = "orders"
version = "1.2.0"
edition = "2021"
build = false
description = "kept out"

[lib]
crate-type = ["rlib"]

[dependencies]
serde = { version = "1", features = ["derive"] }
json = { package = "serde_json", version = "1.0.100", optional = true }
wasmless-sdk = { path = "../../sdk/rust" }

[target.'cfg(target_os = "wasi")'.dependencies]
itoa = "1"

[dev-dependencies]
pretty_assertions = { path = "../pa" }

[features]
default = ["json"]

[profile.release]
opt-level = 0

[workspace]
members = ["x"]
"#,
        ))
        .unwrap();
        assert_eq!(made.crates, ["serde_json 1.0.100", "serde 1", "itoa 1"]);
        let table: toml::Table = made.text.parse().unwrap();
        assert_eq!(
            table["package"]["name"].as_str(),
            Some("orders"),
            "a Cargo.lock names it"
        );
        assert_eq!(table["package"]["version"].as_str(), Some("1.2.0"));
        assert_eq!(table["package"]["edition"].as_str(), Some("2021"));
        assert!(table["package"].get("description").is_none());
        assert_eq!(table["lib"]["name"].as_str(), Some(CRATE_NAME));
        assert_eq!(table["lib"]["crate-type"][0].as_str(), Some("cdylib"));
        let deps = &table["dependencies"];
        assert_eq!(
            deps[SDK_NAME]["path"].as_str(),
            Some("wasmless-sdk"),
            "the builder's SDK"
        );
        assert_eq!(deps["json"]["package"].as_str(), Some("serde_json"));
        assert_eq!(deps["serde"]["features"][0].as_str(), Some("derive"));
        assert_eq!(
            table["target"][r#"cfg(target_os = "wasi")"#]["dependencies"]["itoa"].as_str(),
            Some("1")
        );
        assert_eq!(table["features"]["default"][0].as_str(), Some("json"));
        assert!(table.get("dev-dependencies").is_none(), "tests are not built");
        assert_eq!(table["profile"]["release"]["opt-level"].as_str(), Some("s"));
        assert!(table["workspace"].as_table().unwrap().is_empty());
    }

    #[test]
    fn a_cargo_toml_without_dependencies_needs_no_registry() {
        let made = manifest(&with_manifest(
            "[package]\nname = \"plain\"\n\n[dependencies]\nwasmless-sdk = \"0.1\"\n",
        ))
        .unwrap();
        assert!(made.crates.is_empty());
        let table: toml::Table = made.text.parse().unwrap();
        assert_eq!(
            table["package"]["edition"].as_str(),
            Some("2024"),
            "the builder's default"
        );
    }

    #[test]
    fn what_cannot_work_is_refused_with_what_to_do() {
        for (text, expected) in [
            (
                "[package]\nname = \"f\"\nbuild = \"build.rs\"\n",
                "build scripts are not supported",
            ),
            (
                "[package]\nname = \"f\"\nlinks = \"z\"\n",
                "cannot link a native library",
            ),
            ("[lib]\nproc-macro = true\n", "not a procedural macro"),
            (
                "[package]\nversion.workspace = true\n",
                "package.version is inherited from a workspace",
            ),
            (
                "[dependencies]\nserde = { workspace = true }\n",
                "serde is inherited from a workspace",
            ),
            (
                "[dependencies]\nx = { version = \"1\", registry = \"corp\" }\n",
                "x comes from another registry",
            ),
            (
                "[target.'cfg(unix)'.dependencies]\ny = { git = \"https://e.com/y\" }\n",
                "target.cfg(unix): dependency y comes from a git repository",
            ),
            (
                "[replace]\n\"foo:0.1.0\" = { path = \"x\" }\n",
                "[replace] is not supported",
            ),
            ("[dependencies\n", "TOML parse error"),
        ] {
            let message = refusal(text);
            assert!(message.starts_with("Cargo.toml: "), "{message}");
            assert!(message.contains(expected), "{expected}: {message}");
        }
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
}
