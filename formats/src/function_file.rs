//! What `wasmless dev` needs of a function: a `function.yaml` (the same file
//! `kubectl apply` takes) or a bare source file.

use crate::source::{Language, Source, SourceError};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Why a path is not a function `wasmless dev` can build; each says what to write instead.
#[derive(Debug, thiserror::Error)]
pub enum FunctionFileError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} is not a Function: it needs metadata.name and spec.source: {source}", path.display())]
    NotAFunction { path: PathBuf, source: serde_yaml::Error },
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("{} has no function.yaml and no handler.go, handler.rs or handler.wat", .0.display())]
    NoHandler(PathBuf),
    #[error("{} has several handler files: name the one to serve", .0.display())]
    SeveralHandlers(PathBuf),
    #[error("{}: a prebuilt `module` has nothing to build locally; serve it with `wasmless serve`", .0.display())]
    Prebuilt(PathBuf),
    #[error("{}: spec.source (or Goless's spec.function) holds the handler's source", .0.display())]
    NoSource(PathBuf),
    #[error("{}: give exactly one of spec.source, spec.function and spec.module", .0.display())]
    SeveralSources(PathBuf),
    #[error("cannot tell the language of {}: use .go, .rs, .wat or a function.yaml", .0.display())]
    UnknownExtension(PathBuf),
}

/// A function to build and serve locally.
pub struct LocalFunction {
    pub name: String,
    pub source: Source,
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    /// The file whose change means a rebuild.
    pub watched: PathBuf,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    pub memory: Option<String>,
    pub timeout: Option<String>,
    pub max_concurrency: Option<u32>,
    pub max_request_body: Option<String>,
    /// `request` or `shared` (the runtime's `--isolation`, which refuses anything else).
    pub isolation: Option<String>,
}

#[derive(Deserialize)]
struct FunctionFile {
    metadata: Metadata,
    spec: Spec,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
}

#[derive(Deserialize)]
struct Spec {
    language: Option<String>,
    source: Option<String>,
    /// Goless's name for `source`.
    function: Option<String>,
    module: Option<serde_yaml::Value>,
    #[serde(default)]
    env: Vec<EnvVar>,
    #[serde(default)]
    limits: Limits,
}

#[derive(Deserialize)]
struct EnvVar {
    name: String,
    #[serde(default)]
    value: String,
}

impl LocalFunction {
    /// Reads a directory (its `function.yaml`, or its one handler source file), a
    /// `function.yaml`, or a source file (language from the extension).
    pub fn load(path: &Path) -> Result<Self, FunctionFileError> {
        if path.is_dir() {
            let yaml = path.join("function.yaml");
            if yaml.exists() {
                return Self::from_yaml(&yaml);
            }
            let sources: Vec<PathBuf> = ["handler.go", "handler.rs", "handler.wat", "lib.rs"]
                .iter()
                .map(|name| path.join(name))
                .filter(|p| p.exists())
                .collect();
            return match sources.as_slice() {
                [one] => Self::from_source_file(one),
                [] => Err(FunctionFileError::NoHandler(path.to_path_buf())),
                _ => Err(FunctionFileError::SeveralHandlers(path.to_path_buf())),
            };
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => Self::from_yaml(path),
            _ => Self::from_source_file(path),
        }
    }

    fn from_yaml(path: &Path) -> Result<Self, FunctionFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| FunctionFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml_text(&text, path)
    }

    /// Reads `text`, the contents of the `function.yaml` at `path` (named in errors and
    /// watched for changes).
    pub fn from_yaml_text(text: &str, path: &Path) -> Result<Self, FunctionFileError> {
        let file: FunctionFile = serde_yaml::from_str(text).map_err(|source| FunctionFileError::NotAFunction {
            path: path.to_path_buf(),
            source,
        })?;
        let language: Language = file.spec.language.as_deref().unwrap_or("go").parse()?;
        let text = match (file.spec.source, file.spec.function, file.spec.module) {
            (Some(source), None, None) | (None, Some(source), None) => source,
            (None, None, Some(_)) => return Err(FunctionFileError::Prebuilt(path.to_path_buf())),
            (None, None, None) => return Err(FunctionFileError::NoSource(path.to_path_buf())),
            _ => return Err(FunctionFileError::SeveralSources(path.to_path_buf())),
        };
        Ok(Self {
            source: Source::inline(
                language,
                &format!("{}.{}", file.metadata.name, language.extension()),
                text,
            ),
            name: file.metadata.name,
            env: file.spec.env.into_iter().map(|e| (e.name, e.value)).collect(),
            limits: file.spec.limits,
            watched: path.to_path_buf(),
        })
    }

    fn from_source_file(path: &Path) -> Result<Self, FunctionFileError> {
        let language = match path.extension().and_then(|e| e.to_str()) {
            Some("go") => Language::Go,
            Some("rs") => Language::Rust,
            Some("wat") => Language::Wat,
            Some("wasm") => Language::Wasm,
            _ => return Err(FunctionFileError::UnknownExtension(path.to_path_buf())),
        };
        let name = path
            .parent()
            .and_then(|dir| dir.canonicalize().ok())
            .and_then(|dir| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "function".into());
        Ok(Self {
            name,
            source: Source::read(language, path)?,
            env: Vec::new(),
            limits: Limits::default(),
            watched: path.to_path_buf(),
        })
    }
}
