//! The pool's table: one entry per Function, its port and its own runtime arguments, each
//! from a `<name>.json` file of a directory (which a person with an editor, or a ConfigMap
//! volume, can write) or from a ConfigMap the pool watches through the API ([`super::api`]).
//! One bad entry costs only its own Function.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One Function of the table, as its file says.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub port: u16,
    pub args: Vec<String>,
    /// The Function's Service routes to its own pods now: the pool serves on (a client
    /// may still be routed here) and closes each connection after its response, so a
    /// keep-alive client's next request reaches the pods.
    #[serde(default, rename = "servedByPods")]
    pub served_by_pods: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("cannot read the pool directory {path}: {source}")]
    Directory { path: String, source: std::io::Error },
}

/// One Function's entry, or why it cannot be used, and where it came from (`hello.json`,
/// `ConfigMap hello-pool`) for the messages about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub origin: String,
    pub entry: Result<Entry, String>,
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
            .and_then(|bytes| parse_entry(&bytes));
        table.insert(
            name.to_string(),
            Row {
                origin: format!("{name}.json"),
                entry: parsed,
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
