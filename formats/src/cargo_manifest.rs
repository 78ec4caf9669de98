//! A Rust handler's `Cargo.toml`, combined with the crate the builder generates around the
//! handler: the user lists dependencies, the builder owns the crate.
//!
//! Kept of the user's manifest: the package's `name` and `version` (a `Cargo.lock` names the
//! root package, so the user's lock matches), `edition` (default 2024), `rust-version`,
//! `[features]`, and the registry crates of `[dependencies]` and
//! `[target.<cfg>.dependencies]`. The builder's: the library (its name, `cdylib`, the
//! generated `src/lib.rs`), the SDK dependency, `build = false`, no auto-discovered targets,
//! the profiles and an empty `[workspace]`. Dropped: dev- and build-dependencies and every
//! other table. Refused, with what to do: build scripts, `links`, a proc-macro library,
//! dependencies from a path, git or another registry, `[patch]`/`[replace]`, and workspace
//! inheritance (the crate is built alone).

use toml::{Table, Value};

/// The generated crate's manifest, and the crates it needs from a registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerManifest {
    pub text: String,
    /// `name requirement` of each dependency beside the SDK, in the manifest's order; empty:
    /// none, and no registry is needed.
    pub crates: Vec<String>,
}

/// Combines the user's Cargo.toml `user` with the builder's own manifest `base` (whose
/// `[dependencies]` are the SDK, taking the place of any the user names the same, and whose
/// `[profile]` and `[workspace]` are used), naming the library `lib_name`. The error is the
/// reason, in words for the handler's author.
pub fn handler_manifest(user: &str, base: &str, lib_name: &str) -> Result<HandlerManifest, String> {
    let base: Table = base.parse().expect("the builder's own Cargo.toml parses");
    let sdk = base
        .get("dependencies")
        .and_then(Value::as_table)
        .cloned()
        .unwrap_or_default();
    let user: Table = user.parse().map_err(|e: toml::de::Error| e.to_string())?;
    for key in ["patch", "replace"] {
        if user.contains_key(key) {
            return Err(format!(
                "[{key}] is not supported: dependencies come from the configured crates registry as published; depend on a published version instead"
            ));
        }
    }
    let empty = Table::new();
    let package = match user.get("package") {
        Some(Value::Table(package)) => package,
        None => &empty,
        Some(_) => return Err("`package` is not a table".into()),
    };
    if let Some((key, _)) = package.iter().find(|(_, v)| inherits(v)) {
        return Err(format!(
            "package.{key} is inherited from a workspace: the handler is built alone, so write the value out"
        ));
    }
    if package.get("build").is_some_and(|b| b.as_bool() != Some(false)) {
        return Err(
            "package.build: build scripts are not supported (the handler is built for wasm32-wasip2 with no native code); remove it".into(),
        );
    }
    if package.contains_key("links") {
        return Err(
            "package.links: a handler cannot link a native library (it is built for wasm32-wasip2); remove it".into(),
        );
    }
    if user
        .get("lib")
        .and_then(|lib| lib.get("proc-macro").or_else(|| lib.get("proc_macro")))
        .and_then(Value::as_bool)
        == Some(true)
    {
        return Err(
            "lib.proc-macro: a handler is the library the runtime calls, not a procedural macro; depend on proc-macro crates instead".into(),
        );
    }

    let mut out_package = Table::new();
    let keep = |key: &str, default: &str| package.get(key).cloned().unwrap_or_else(|| Value::from(default));
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

    let mut crates = Vec::new();
    let mut normal = dependencies(user.get("dependencies"), &sdk, &mut crates)?;
    normal.extend(sdk.clone());
    let mut targets = Table::new();
    if let Some(user_targets) = user.get("target").and_then(Value::as_table) {
        for (cfg, tables) in user_targets {
            let deps = dependencies(tables.get("dependencies"), &sdk, &mut crates)
                .map_err(|why| format!("target.{cfg}: {why}"))?;
            if !deps.is_empty() {
                targets.insert(
                    cfg.clone(),
                    Value::Table(Table::from_iter([("dependencies".into(), deps.into())])),
                );
            }
        }
    }

    let mut out = Table::new();
    out.insert("package".into(), out_package.into());
    let lib = [
        ("name", Value::from(lib_name)),
        ("path", "src/lib.rs".into()),
        ("crate-type", Value::Array(vec!["cdylib".into()])),
    ];
    out.insert(
        "lib".into(),
        Value::Table(lib.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
    );
    out.insert("dependencies".into(), normal.into());
    if !targets.is_empty() {
        out.insert("target".into(), targets.into());
    }
    if let Some(features) = user.get("features") {
        if !features.is_table() {
            return Err("`features` is not a table".into());
        }
        out.insert("features".into(), features.clone());
    }
    for key in ["profile", "workspace"] {
        if let Some(value) = base.get(key) {
            out.insert(key.into(), value.clone());
        }
    }
    let text = toml::to_string(&out).map_err(|e| format!("cannot be written back: {e}"))?;
    Ok(HandlerManifest {
        text: format!("# Generated by wasmless-builder from the handler's Cargo.toml.\n{text}"),
        crates,
    })
}

/// Whether a manifest value is `{ workspace = true }` (also written `key.workspace = true`).
fn inherits(value: &Value) -> bool {
    value.get("workspace").is_some()
}

/// The registry dependencies of a `[dependencies]` table, the builder's `sdk` left out;
/// appends `name requirement` of each to `crates`. A dependency that is not a crate from the
/// registry is refused.
fn dependencies(table: Option<&Value>, sdk: &Table, crates: &mut Vec<String>) -> Result<Table, String> {
    let mut out = Table::new();
    let Some(table) = table else { return Ok(out) };
    let table = table.as_table().ok_or("`dependencies` is not a table")?;
    for (name, spec) in table {
        let package = spec.get("package").and_then(Value::as_str).unwrap_or(name);
        if sdk.contains_key(package) || sdk.contains_key(name) {
            continue;
        }
        let requirement = match spec {
            Value::String(version) => version.clone(),
            Value::Table(spec) => {
                if spec.contains_key("workspace") {
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
                spec.get("version").and_then(Value::as_str).unwrap_or("*").to_string()
            }
            _ => return Err(format!("dependency {name} is neither a version nor a table")),
        };
        crates.push(format!("{package} {requirement}"));
        out.insert(name.clone(), spec.clone());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[package]\nname = \"wasmless-handler\"\n\n[dependencies]\nwasmless-sdk = { path = \"wasmless-sdk\" }\n\n[profile.release]\nopt-level = \"s\"\n\n[workspace]\n";

    fn made(user: &str) -> Result<HandlerManifest, String> {
        handler_manifest(user, BASE, "wasmless_handler")
    }

    #[test]
    fn the_users_dependencies_go_into_the_builders_crate() {
        let made = made(
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
        )
        .unwrap();
        assert_eq!(made.crates, ["serde_json 1.0.100", "serde 1", "itoa 1"]);
        let table: Table = made.text.parse().unwrap();
        assert_eq!(
            table["package"]["name"].as_str(),
            Some("orders"),
            "a Cargo.lock names it"
        );
        assert_eq!(table["package"]["version"].as_str(), Some("1.2.0"));
        assert_eq!(table["package"]["edition"].as_str(), Some("2021"));
        assert!(table["package"].get("description").is_none());
        assert_eq!(table["lib"]["name"].as_str(), Some("wasmless_handler"));
        assert_eq!(table["lib"]["crate-type"][0].as_str(), Some("cdylib"));
        let deps = &table["dependencies"];
        assert_eq!(
            deps["wasmless-sdk"]["path"].as_str(),
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
        let made = made("[package]\nname = \"plain\"\n\n[dependencies]\nwasmless-sdk = \"0.1\"\n").unwrap();
        assert!(made.crates.is_empty());
        let table: Table = made.text.parse().unwrap();
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
            ("features = 3\n", "`features` is not a table"),
        ] {
            let message = made(text).unwrap_err();
            assert!(message.contains(expected), "{expected}: {message}");
        }
    }
}
