//! The pool's table: one entry per Function, its port and its own runtime arguments, each
//! from a `<name>.json` file of a directory (which a person with an editor, or a ConfigMap
//! volume, can write) or from a ConfigMap the pool watches through the API ([`super::api`]).
//! One bad entry costs only its own Function.

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One Function of the table, as its file says.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub port: u16,
    pub args: Vec<String>,
    /// The Function's Service routes to its own pods now: the pool serves on (a client
    /// may still be routed here) and closes each connection after its response, so a
    /// keep-alive client's next request reaches the pods.
    #[serde(default, rename = "servedByPods")]
    pub served_by_pods: bool,
    /// The variables a dedicated pod's container would have (`WASMLESS_HANDLER_ENV_*`,
    /// `WASMLESS_OUTBOUND_HEADER_*`), in core/v1's shape: literal values, and values from
    /// the namespace's Secrets and ConfigMaps, which the pool reads as the kubelet would
    /// for a pod ([`super::references`]). No `$(VAR)` expansion: a value is taken as is.
    #[serde(default)]
    pub env: Vec<EnvVar>,
    #[serde(default, rename = "envFrom")]
    pub env_from: Vec<EnvFromSource>,
    /// Changes when an object `env` or `envFrom` reads changes (the operator's hash of
    /// their resourceVersions): the entry then differs, and its values are read again.
    #[serde(default, rename = "configHash")]
    pub config_hash: Option<String>,
    /// `env` and `envFrom` resolved: the Function's variables, never serialised or logged.
    #[serde(skip)]
    pub resolved: Resolved,
}

impl Entry {
    /// Whether it reads anything from the API (a Secret or a ConfigMap).
    pub fn reads_objects(&self) -> bool {
        !self.env_from.is_empty() || self.env.iter().any(|var| var.value_from.is_some())
    }

    /// The same Function, served the same way, whatever its route: only `servedByPods`
    /// may differ.
    pub fn same_but_route(&self, other: &Entry) -> bool {
        Entry {
            served_by_pods: other.served_by_pods,
            ..self.clone()
        } == *other
    }
}

/// A Function's variables from its entry's `env` and `envFrom`, by name, as its runtime
/// would find them in its environment. Its `Debug` shows names only.
#[derive(Clone, Default, PartialEq)]
pub struct Resolved(pub Vec<(String, String)>);

impl std::fmt::Debug for Resolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|(name, _)| name)).finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("cannot read the pool directory {path}: {source}")]
    Directory { path: String, source: std::io::Error },
}

/// One Function's entry, or why it cannot be used, and where it came from (`hello.json`,
/// `ConfigMap hello-pool`) for the messages about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub origin: String,
    pub entry: Result<Entry, String>,
    /// When its writer first claimed the port (a ConfigMap's creation, which an edit does
    /// not move): of two entries naming one port that neither holds yet, as when the pool
    /// starts, the older gets it, so an entry written later cannot take a port by its name
    /// sorting first. `None` (a file) comes after any time, then names decide.
    pub claimed_since: Option<Time>,
}

/// The table by Function name (a file's name without `.json`; a ConfigMap's function label).
pub type Table = BTreeMap<String, Row>;

/// An entry's JSON, wherever it is stored.
pub fn parse_entry(bytes: &[u8]) -> Result<Entry, String> {
    serde_json::from_slice::<Entry>(bytes)
        .map_err(|error| format!(r#"it is not {{"port": <number>, "args": ["--function", ...]}}: {error}"#))
}

/// Reads every `*.json` file of `dir`; hidden entries (a ConfigMap volume's `..data`) are
/// skipped.
pub fn read(dir: &Path) -> Result<Table, TableError> {
    let entries = std::fs::read_dir(dir).map_err(|source| TableError::Directory {
        path: dir.display().to_string(),
        source,
    })?;
    let mut table = Table::new();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str().and_then(|name| name.strip_suffix(".json")) else {
            continue;
        };
        if name.starts_with('.') || name.is_empty() {
            continue;
        }
        let parsed = std::fs::read(entry.path())
            .map_err(|error| format!("cannot read it: {error}"))
            .and_then(|bytes| parse_entry(&bytes))
            .and_then(resolve_literal);
        table.insert(
            name.to_string(),
            Row {
                origin: format!("{name}.json"),
                entry: parsed,
                claimed_since: None,
            },
        );
    }
    Ok(table)
}

/// Changes whenever a file of the table, or what a ConfigMap volume's symlinks point to,
/// changes.
pub fn fingerprint(dir: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default();
    paths.sort();
    for path in paths {
        path.hash(&mut hasher);
        if let Ok(meta) = std::fs::metadata(&path) {
            (meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino()).hash(&mut hasher);
        }
    }
    hasher.finish()
}

/// For a table that is not read from the API (a directory): literal values only.
pub fn resolve_literal(mut entry: Entry) -> Result<Entry, String> {
    if entry.reads_objects() {
        return Err(
            "its env reads Secrets or ConfigMaps (valueFrom, envFrom), which only a pool whose table is read from the API (--pool api:...) can"
                .into(),
        );
    }
    entry.resolved = Resolved(
        entry
            .env
            .iter()
            .map(|var| (var.name.clone(), var.value.clone().unwrap_or_default()))
            .collect(),
    );
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_json_files_and_says_what_is_wrong_with_the_others() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("hello.json"),
            r#"{"port": 20001, "args": ["--function", "hello", "--module", "/m.wasm"]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("broken.json"), r#"{"port": "x"}"#).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "not a Function").unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        let table = read(dir.path()).unwrap();
        assert_eq!(table.len(), 2, "{table:?}");
        let hello = table["hello"].entry.as_ref().unwrap();
        assert_eq!(hello.port, 20001);
        assert_eq!(hello.args[1], "hello");
        assert_eq!(table["broken"].origin, "broken.json");
        let broken = table["broken"].entry.as_ref().unwrap_err();
        assert!(broken.contains(r#"{"port": <number>"#), "{broken}");
    }
}
