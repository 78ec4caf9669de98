//! What `wasmless dev` needs of a function: a `function.yaml` (the same file
//! `kubectl apply` takes) or a bare source file.

use crate::source::{Language, Source, SourceError, SourceFile};
use serde::Deserialize;
use std::collections::BTreeMap;
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
    #[error(
        "{}: spec.source (or Goless's spec.function) holds the handler's source, or a handler.go (handler.rs, handler.wat) beside the function.yaml",
        .0.display()
    )]
    NoSource(PathBuf),
    #[error(
        "{} holds the handler's source and {} is beside it: keep one (without spec.source, the file is the source)",
        yaml.display(),
        handler.display()
    )]
    TwoSources { yaml: PathBuf, handler: PathBuf },
    #[error("{}: spec.language is {language}, but the handler beside it is {}", yaml.display(), handler.display())]
    LanguageNotTheHandlers {
        yaml: PathBuf,
        language: String,
        handler: PathBuf,
    },
    #[error("{}: give exactly one of spec.source, spec.function and spec.module", .0.display())]
    SeveralSources(PathBuf),
    #[error("cannot tell the language of {}: use .go, .rs, .wat or a function.yaml", .0.display())]
    UnknownExtension(PathBuf),
}

/// The names a folder's one handler file goes by, each in its language.
const HANDLER_FILES: [(&str, &str); 4] = [
    ("handler.go", "go"),
    ("handler.rs", "rust"),
    ("handler.wat", "wat"),
    ("lib.rs", "rust"),
];

/// The one handler file of `dir` and its language's name, if it holds one.
fn handler_in(dir: &Path) -> Result<Option<(PathBuf, &'static str)>, FunctionFileError> {
    let found: Vec<(PathBuf, &str)> = HANDLER_FILES
        .iter()
        .map(|(name, language)| (dir.join(name), *language))
        .filter(|(path, _)| path.is_file())
        .collect();
    match found.len() {
        0 | 1 => Ok(found.into_iter().next()),
        _ => Err(FunctionFileError::SeveralHandlers(dir.to_path_buf())),
    }
}

/// The handler file beside the `function.yaml` at `yaml` in folder `dir`, when the
/// Function it holds (`function`) names no source (no `spec.source`, Goless's
/// `spec.function` or `spec.module`): the settings in the yaml and the code in a file of
/// its own, as a user lays a folder out. The code is then the folder's, read as it would be
/// without the yaml (module files and the files beside the handler included), and
/// `spec.language`, where the yaml gives one, must be the file's. A yaml that holds a
/// source with a handler file beside it is refused, as that file would never be built.
/// `wasmless dev` and `wasmless deploy` both read a folder so.
pub fn handler_beside(
    function: &serde_json::Value,
    yaml: &Path,
    dir: &Path,
) -> Result<Option<PathBuf>, FunctionFileError> {
    let spec = &function["spec"];
    if !spec.is_object() || spec.get("module").is_some() {
        return Ok(None);
    }
    let Some((handler, language)) = handler_in(dir)? else {
        return Ok(None);
    };
    // Edits to a file that is not built would change nothing, silently.
    if ["source", "function"].iter().any(|key| spec.get(key).is_some()) {
        return Err(FunctionFileError::TwoSources {
            yaml: yaml.to_path_buf(),
            handler,
        });
    }
    match spec.get("language").and_then(|l| l.as_str()) {
        Some(written) if written != language => Err(FunctionFileError::LanguageNotTheHandlers {
            yaml: yaml.to_path_buf(),
            language: written.to_string(),
            handler,
        }),
        _ => Ok(Some(handler)),
    }
}

/// A function to build and serve locally.
pub struct LocalFunction {
    pub name: String,
    pub source: Source,
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    /// The file whose change means a rebuild, or the directory any of whose files does.
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
    /// More files of the source by name (`go.mod`, `go.sum`, more handler files).
    #[serde(default)]
    files: BTreeMap<String, String>,
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
    /// `function.yaml`, or a source file (language from the extension). A directory with
    /// a `go.mod` (or `Cargo.toml`) is a module: its handler's every file and the module
    /// files are the source, and a `function.yaml` there that names no `files` takes the
    /// module files beside it.
    pub fn load(path: &Path) -> Result<Self, FunctionFileError> {
        if path.is_dir() {
            let yaml = path.join("function.yaml");
            if yaml.exists() {
                let mut function = Self::from_yaml_in(&yaml, path)?;
                // A function.yaml that names no files takes those beside it, as `deploy` does.
                if function.watched != path && function.source.all_files().count() == 1 {
                    let module_files = crate::folder::files_beside(function.source.language, path)?;
                    if !module_files.is_empty() {
                        let language = function.source.language;
                        let mut files = function.source.files;
                        for file in &mut files {
                            // The name the cluster builds it as, so the digests agree.
                            file.name = language.inline_file_name().to_string();
                        }
                        files.extend(module_files);
                        function.source = Source::from_files(language, files);
                        function.watched = path.to_path_buf();
                    }
                }
                return Ok(function);
            }
            // A Rust handler laid out as a Cargo package: Cargo.toml, src/lib.rs and more.
            if path.join("Cargo.toml").is_file() && path.join("src/lib.rs").is_file() {
                let name = path
                    .canonicalize()
                    .ok()
                    .and_then(|dir| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .unwrap_or_else(|| "function".into());
                return Ok(Self {
                    name,
                    source: Source::read(Language::Rust, path)?,
                    env: Vec::new(),
                    limits: Limits::default(),
                    watched: path.to_path_buf(),
                });
            }
            return match handler_in(path)? {
                Some((handler, _)) => Self::from_source_file(&handler, true),
                None => Err(FunctionFileError::NoHandler(path.to_path_buf())),
            };
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => Self::from_yaml(path),
            _ => Self::from_source_file(path, false),
        }
    }

    /// The `function.yaml` at `yaml` in folder `dir`, with the folder's code when it names
    /// no source of its own ([`handler_beside`]).
    fn from_yaml_in(yaml: &Path, dir: &Path) -> Result<Self, FunctionFileError> {
        let text = std::fs::read_to_string(yaml).map_err(|source| FunctionFileError::Read {
            path: yaml.to_path_buf(),
            source,
        })?;
        let mut function: serde_json::Value =
            serde_yaml::from_str(&text).map_err(|source| FunctionFileError::NotAFunction {
                path: yaml.to_path_buf(),
                source,
            })?;
        let Some(handler) = handler_beside(&function, yaml, dir)? else {
            return Self::from_yaml_text(&text, yaml);
        };
        let handler_text = std::fs::read_to_string(&handler).map_err(|source| FunctionFileError::Read {
            path: handler.clone(),
            source,
        })?;
        let names_files = function["spec"].get("files").is_some();
        function["spec"]["source"] = handler_text.into();
        // JSON is YAML: the settings as written, with the handler as the source.
        let settings = Self::from_yaml_text(&function.to_string(), yaml)?;
        // The code as `wasmless dev <dir>` reads it, unless the yaml names the files.
        let source = match names_files {
            true => settings.source,
            false => Self::from_source_file(&handler, true)?.source,
        };
        Ok(Self {
            source,
            watched: dir.to_path_buf(),
            ..settings
        })
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
        let source = if file.spec.files.is_empty() {
            Source::inline(
                language,
                &format!("{}.{}", file.metadata.name, language.extension()),
                text,
            )
        } else {
            // As the cluster builds it: the source under its name there, each file under its own.
            let mut files = vec![SourceFile {
                name: language.inline_file_name().to_string(),
                bytes: text.into_bytes(),
            }];
            files.extend(file.spec.files.into_iter().map(|(name, text)| SourceFile {
                name,
                bytes: text.into_bytes(),
            }));
            Source::from_files(language, files)
        };
        Ok(Self {
            source,
            name: file.metadata.name,
            env: file.spec.env.into_iter().map(|e| (e.name, e.value)).collect(),
            limits: file.spec.limits,
            watched: path.to_path_buf(),
        })
    }

    fn from_source_file(path: &Path, folder_named: bool) -> Result<Self, FunctionFileError> {
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
        // Beside a go.mod (or Cargo.toml), the handler is its directory's module.
        let dir = path
            .parent()
            .filter(|dir| !dir.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let is_module = language.module_file_names().iter().any(|name| dir.join(name).is_file());
        // The files a Go handler ships beside it come with a folder named as the Function,
        // never with a file named in a folder that happens to hold others.
        let beside = match (is_module, language) {
            (false, Language::Go) if folder_named => crate::folder::files_beside(language, dir)?,
            _ => Vec::new(),
        };
        let (source, watched) = if is_module {
            (Source::read(language, dir)?, dir.to_path_buf())
        } else if !beside.is_empty() {
            // The handler under the name the cluster builds it as, so the digests agree.
            let mut files = Source::read(language, path)?.files;
            files[0].name = language.inline_file_name().to_string();
            files.extend(beside);
            (Source::from_files(language, files), dir.to_path_buf())
        } else {
            (Source::read(language, path)?, path.to_path_buf())
        };
        Ok(Self {
            name,
            source,
            env: Vec::new(),
            limits: Limits::default(),
            watched,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HANDLER: &str =
        "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {}\n";
    const GO_MOD: &str = "module example.com/f\n\ngo 1.21\n";

    #[test]
    fn a_module_directory_is_built_whole_and_watched_whole() {
        let dir = std::env::temp_dir().join(format!("wasmless-function-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("handler.go"), HANDLER).unwrap();
        std::fs::write(dir.join("routes.go"), "package handlers\n").unwrap();
        std::fs::write(dir.join("go.mod"), GO_MOD).unwrap();
        let function = LocalFunction::load(&dir).unwrap();
        assert_eq!(function.watched, dir, "an edit of go.mod or go.sum rebuilds too");
        assert_eq!(function.source.files.len(), 2);
        assert_eq!(function.source.module_files[0].name, "go.mod");

        // A function.yaml there of settings alone takes the folder's code as it is without
        // the yaml (the module, the handler's other files), named as the cluster builds
        // them, so `dev` and the cluster compute one digest.
        let yaml = "apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: f}\nspec:\n  language: go\n";
        std::fs::write(dir.join("function.yaml"), yaml).unwrap();
        let from_dir = LocalFunction::load(&dir).unwrap();
        let inline = format!(
            "{yaml}  source: {HANDLER:?}\n  files:\n    go.mod: {GO_MOD:?}\n    routes.go: \"package handlers\\n\"\n"
        );
        let from_yaml = LocalFunction::from_yaml_text(&inline, Path::new("function.yaml")).unwrap();
        // A yaml that holds a source too is refused: the handler.go beside it would not be built.
        std::fs::write(dir.join("function.yaml"), &inline).unwrap();
        let two = LocalFunction::load(&dir).err().unwrap().to_string();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(two.contains("keep one"), "{two}");
        assert_eq!(from_dir.name, "f");
        assert_eq!(from_dir.watched, dir);
        assert_eq!(from_dir.source.module_files.len(), 1);
        assert_eq!(from_dir.source.files[0].name, "handler.go");
        assert_eq!(from_dir.source.digest("1"), from_yaml.source.digest("1"));
        let files = [
            ("handler.go", HANDLER.as_bytes()),
            ("go.mod", GO_MOD.as_bytes()),
            ("routes.go", "package handlers\n".as_bytes()),
        ];
        assert_eq!(
            from_yaml.source.digest("1"),
            crate::source::files_digest("go", "1", &files),
            "the digest the operator computes from the Function"
        );
    }

    #[test]
    fn a_folder_named_brings_its_files_and_a_file_named_brings_none() {
        let dir = std::env::temp_dir().join(format!("wasmless-function-file-beside-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("templates")).unwrap();
        std::fs::write(dir.join("handler.go"), HANDLER).unwrap();
        std::fs::write(dir.join("templates/index.html"), "<p>").unwrap();
        std::fs::write(dir.join("credentials.json"), "{}").unwrap();
        std::fs::write(dir.join(".wasmlessignore"), "credentials.json\n").unwrap();
        let folder = LocalFunction::load(&dir).unwrap();
        let names: Vec<&str> = folder.source.all_files().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["handler.go", "templates/index.html"]);
        assert_eq!(folder.watched, dir);
        std::fs::remove_file(dir.join(".wasmlessignore")).unwrap();
        let file = LocalFunction::load(&dir.join("handler.go")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            file.source.all_files().count(),
            1,
            "the folder a named file is in is not shipped"
        );
    }
}
