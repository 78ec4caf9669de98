//! A handler's source as the user wrote it, and the checks that give a one-line reason
//! before any compiler runs.

mod file_names;
pub mod folder;

pub use file_names::{case_clash, file_name_problem};
use std::path::{Path, PathBuf};
use wasmless_artifact::Digest;

/// Largest source the builder accepts, as the CRD does: all its files together.
pub const MAX_SOURCE_BYTES: usize = wasmless_artifact::guest_files::MAX_BYTES;
/// Most files a Function's `spec.files` holds (data and templates included).
pub const MAX_FILES: usize = wasmless_artifact::guest_files::MAX_FILES;
/// Longest name of one of those files.
pub const MAX_FILE_NAME_BYTES: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Language {
    Go,
    Rust,
    Wat,
    Wasm,
}

impl Language {
    pub fn name(self) -> &'static str {
        match self {
            Self::Go => "go",
            Self::Rust => "rust",
            Self::Wat => "wat",
            Self::Wasm => "wasm",
        }
    }

    /// The files beside the handler's source that say how to build it (Go's module and
    /// its checksums, Cargo's manifest and lock): read from a source directory with the
    /// handler's files, and allowed by name in a Function's `spec.files`.
    pub fn module_file_names(self) -> &'static [&'static str] {
        match self {
            Self::Go => &["go.mod", "go.sum"],
            Self::Rust => &["Cargo.lock", "Cargo.toml"],
            Self::Wat | Self::Wasm => &[],
        }
    }

    /// The name a Function's inline `source` is built as, beside its `files` (the name the
    /// operator mounts it under in the build Job).
    pub fn inline_file_name(self) -> &'static str {
        match self {
            Self::Go => "handler.go",
            Self::Rust => "lib.rs",
            Self::Wat => "module.wat",
            Self::Wasm => "module.wasm",
        }
    }

    /// Whether `name` (a path from the handler's folder) is one of the handler's own source
    /// files, compiled as `package handlers` (a `.go` file, not `_test.go`; a `.rs` file),
    /// rather than one of its module files or a data file it ships.
    pub fn is_handler_file(self, name: &str) -> bool {
        let extension = format!(".{}", self.extension());
        !name.contains('/')
            && name.len() > extension.len()
            && name.ends_with(&extension)
            && !(self == Self::Go && name.ends_with("_test.go"))
            && matches!(self, Self::Go | Self::Rust)
    }

    /// File extension of a source file in this language.
    pub fn extension(self) -> &'static str {
        match self {
            Self::Go => "go",
            Self::Rust => "rs",
            Self::Wat => "wat",
            Self::Wasm => "wasm",
        }
    }
}

impl std::str::FromStr for Language {
    type Err = SourceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "go" => Ok(Self::Go),
            "rust" => Ok(Self::Rust),
            "wat" => Ok(Self::Wat),
            "wasm" => Ok(Self::Wasm),
            other => Err(SourceError::UnknownLanguage(other.to_string())),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("unknown language {0:?}: use go, rust, wat or wasm")]
    UnknownLanguage(String),
    #[error("cannot read the source {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the source is empty")]
    Empty,
    #[error(
        "the source is {0} bytes, over the {MAX_SOURCE_BYTES}-byte limit: keep handlers small, or build the module yourself and use language wasm"
    )]
    TooLarge(usize),
    #[error("the source directory {0} has no .{1} files")]
    NoFiles(PathBuf, &'static str),
    #[error(
        "{file} is `package {found}`: Goless handlers are `package handlers` with `func Handler(w http.ResponseWriter, r *http.Request)`"
    )]
    WrongPackage { file: String, found: String },
    #[error("{0} has no package clause: start it with `package handlers`")]
    NoPackage(String),
    #[error(
        "no `func Handler(w http.ResponseWriter, r *http.Request)` in the Go source: the runtime calls handlers.Handler"
    )]
    NoGoHandler,
    #[error("no `pub fn handler(request: Request) -> Response` in the Rust source: the runtime calls that function")]
    NoRustHandler,
    #[error("{0}")]
    FileName(String),
    #[error("go.sum without go.mod: give the go.mod it goes with, or neither")]
    GoSumWithoutGoMod,
    #[error("Cargo.lock without Cargo.toml: give the Cargo.toml it goes with, or neither")]
    CargoLockWithoutCargoToml,
    #[error(
        "{0}: a Function's files are flat, so the handler's modules are files directly in src/ (src/lib.rs and src/<module>.rs), not in directories below it"
    )]
    NestedModule(PathBuf),
    #[error("{}: line {line:?} is not one wasmless reads: write a name or a glob a line (`*.log`, `raw/`, `/notes.txt`), without `!`", path.display())]
    IgnoreFile { path: PathBuf, line: String },
    #[error("{} holds {count} files or more, over the limit of the handler and {MAX_FILES} files beside it: list what the handler does not need in {}", dir.display(), folder::IGNORE_FILE)]
    TooManyFiles { dir: PathBuf, count: usize },
    #[error("{} holds {total} bytes of files, over the {MAX_SOURCE_BYTES}-byte limit; the largest: {largest}. List what the handler does not need in {}, or build the module yourself and use language wasm", dir.display(), folder::IGNORE_FILE)]
    FolderTooLarge { dir: PathBuf, total: u64, largest: String },
    #[error("{} is not UTF-8 text: a Function holds its files as text (spec.files is a map of strings). List it in {}, or ship it as text (base64, say) and decode it in the handler", .0.display(), folder::IGNORE_FILE)]
    NotText(PathBuf),
    #[error("{} is a link to {}, outside the handler's folder: copy the file in, or list it in {}", link.display(), target.display(), folder::IGNORE_FILE)]
    LinkOutside { link: PathBuf, target: PathBuf },
    #[error("{}: folders nest too deep (a link to a folder above?)", .0.display())]
    TooDeep(PathBuf),
}

/// [`Source::digest`] of files by name (in any order), for a language by its name: what the
/// operator computes from a Function's `source` and `files` without reading them as a
/// [`Source`]. One file hashes as its bytes alone; several, sorted by name, as
/// length-prefixed name and bytes each.
pub fn files_digest(language: &str, builder_version: &str, files: &[(&str, &[u8])]) -> Digest {
    let mut sorted = files.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let canonical = match sorted.as_slice() {
        [(_, single)] => single.to_vec(),
        files => {
            let mut joined = Vec::new();
            for (name, bytes) in files {
                for part in [name.as_bytes(), bytes] {
                    joined.extend_from_slice(&(part.len() as u64).to_le_bytes());
                    joined.extend_from_slice(part);
                }
            }
            joined
        }
    };
    Digest::of_source(language, builder_version, &canonical)
}

/// The handler's files, read once: a single file, or every file of the language in a
/// directory (sorted by name), and the module files beside them (`go.mod`, `go.sum`,
/// `Cargo.toml`; sorted by name).
#[derive(Debug, Clone)]
pub struct Source {
    pub language: Language,
    pub files: Vec<SourceFile>,
    /// The language's [`Language::module_file_names`] that were given.
    pub module_files: Vec<SourceFile>,
    /// Every other file (data, templates, in folders or not), which the handler ships:
    /// written beside its source for `//go:embed`, and its working directory at run time.
    pub data_files: Vec<SourceFile>,
}

#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Name relative to the source directory (the file name for a single file).
    pub name: String,
    pub bytes: Vec<u8>,
}

impl Source {
    pub fn read(language: Language, path: &Path) -> Result<Self, SourceError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| SourceError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let files = if path.is_dir() {
            if let Some(source) = Self::read_cargo_package(language, path)? {
                return Ok(source);
            }
            let mut files = folder::read_folder(path, &folder::Ignore::of(path)?)?;
            // Only a Go handler ships data files; other languages' folders give their source.
            if language != Language::Go {
                files.retain(|f| {
                    language.is_handler_file(&f.name) || language.module_file_names().contains(&f.name.as_str())
                });
            }
            let source = Self::from_files(language, files);
            if source.files.is_empty() {
                return Err(SourceError::NoFiles(path.to_path_buf(), language.extension()));
            }
            return Ok(source);
        } else {
            let name = path
                .file_name()
                .map_or("source".into(), |n| n.to_string_lossy().into_owned());
            vec![SourceFile {
                name,
                bytes: read(path)?,
            }]
        };
        Ok(Self {
            language,
            files,
            module_files: Vec::new(),
            data_files: Vec::new(),
        })
    }

    /// A Rust handler laid out as a Cargo package — `Cargo.toml` (and `Cargo.lock`) beside
    /// `src/lib.rs` — as the flat files a Function holds: the `.rs` files of `src/` by their
    /// names, and the module files. `None` for any other directory.
    fn read_cargo_package(language: Language, dir: &Path) -> Result<Option<Self>, SourceError> {
        let src = dir.join("src");
        if language != Language::Rust || !dir.join("Cargo.toml").is_file() || !src.join("lib.rs").is_file() {
            return Ok(None);
        }
        let entries = std::fs::read_dir(&src).map_err(|source| SourceError::Read {
            path: src.clone(),
            source,
        })?;
        let mut files = Self::module_files_in(language, dir)?;
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                // src/bin and the like hold no module of the library; a module directory does.
                if std::fs::read_dir(&path)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "rs"))
                    && name != "bin"
                {
                    return Err(SourceError::NestedModule(path));
                }
            } else if path.extension().is_some_and(|x| x == "rs") && !name.starts_with('.') {
                let bytes = std::fs::read(&path).map_err(|source| SourceError::Read { path, source })?;
                files.push(SourceFile { name, bytes });
            }
        }
        Ok(Some(Self::from_files(language, files)))
    }

    /// The language's [`Language::module_file_names`] found in `dir`, sorted by name.
    pub fn module_files_in(language: Language, dir: &Path) -> Result<Vec<SourceFile>, SourceError> {
        let mut found = Vec::new();
        for name in language.module_file_names() {
            let path = dir.join(name);
            if path.is_file() {
                let bytes = std::fs::read(&path).map_err(|source| SourceError::Read { path, source })?;
                found.push(SourceFile {
                    name: (*name).to_string(),
                    bytes,
                });
            }
        }
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(found)
    }

    /// A single-file source held in memory (inline Function source).
    pub fn inline(language: Language, name: &str, text: impl Into<Vec<u8>>) -> Self {
        Self::from_files(
            language,
            vec![SourceFile {
                name: name.to_string(),
                bytes: text.into(),
            }],
        )
    }

    /// Files by name, as a Function holds them (its `source` under the name it is built
    /// as, and its `files`): the language's module files apart, each part sorted by name.
    /// Names are checked by [`Source::check`].
    pub fn from_files(language: Language, files: Vec<SourceFile>) -> Self {
        let (mut module_files, others): (Vec<_>, Vec<_>) = files
            .into_iter()
            .partition(|f| language.module_file_names().contains(&f.name.as_str()));
        // A single file is the handler whatever its name (`wasmless build x.go`, a Function's
        // inline source); beside others, only the language's source files are.
        let single = others.len() == 1 && module_files.is_empty();
        let (mut files, mut data_files): (Vec<_>, Vec<_>) = others
            .into_iter()
            .partition(|f| single || language.is_handler_file(&f.name) || !matches!(language, Language::Go));
        files.sort_by(|a, b| a.name.cmp(&b.name));
        module_files.sort_by(|a, b| a.name.cmp(&b.name));
        data_files.sort_by(|a, b| a.name.cmp(&b.name));
        Self {
            language,
            files,
            module_files,
            data_files,
        }
    }

    /// Every file: the handler's, the module files, then the data files.
    pub fn all_files(&self) -> impl Iterator<Item = &SourceFile> {
        self.files.iter().chain(&self.module_files).chain(&self.data_files)
    }

    /// The module file of this name, if given.
    pub fn module_file(&self, name: &str) -> Option<&SourceFile> {
        self.module_files.iter().find(|f| f.name == name)
    }

    pub fn total_bytes(&self) -> usize {
        self.all_files().map(|f| f.bytes.len()).sum()
    }

    /// The `sourceDigest` (docs/architecture.md), for the builder of `builder_version`, over
    /// every file, module files included (a changed `go.sum` builds again). A single file
    /// hashes as its bytes alone, so an inline source without `files` keeps the digest it
    /// always had; several files hash with their names, sorted by name, which is how the
    /// operator (from the Function) and the builder (from the mounted directory) both see
    /// them.
    pub fn digest(&self, builder_version: &str) -> Digest {
        let files: Vec<(&str, &[u8])> = self
            .all_files()
            .map(|f| (f.name.as_str(), f.bytes.as_slice()))
            .collect();
        files_digest(self.language.name(), builder_version, &files)
    }

    /// The checks that need no compiler.
    pub fn check(&self) -> Result<(), SourceError> {
        let total = self.total_bytes();
        if total > MAX_SOURCE_BYTES {
            return Err(SourceError::TooLarge(total));
        }
        if self.all_files().count() > 1 {
            for file in self.all_files() {
                if let Some(problem) = file_name_problem(self.language, &file.name) {
                    return Err(SourceError::FileName(problem));
                }
            }
            if let Some(problem) = case_clash(self.all_files().map(|file| file.name.as_str())) {
                return Err(SourceError::FileName(problem));
            }
        }
        if self.module_file("go.sum").is_some() && self.module_file("go.mod").is_none() {
            return Err(SourceError::GoSumWithoutGoMod);
        }
        if self.module_file("Cargo.lock").is_some() && self.module_file("Cargo.toml").is_none() {
            return Err(SourceError::CargoLockWithoutCargoToml);
        }
        if self.files.iter().all(|f| f.bytes.iter().all(u8::is_ascii_whitespace)) {
            return Err(SourceError::Empty);
        }
        match self.language {
            Language::Go => self.check_go(),
            Language::Rust => self.check_rust(),
            Language::Wat | Language::Wasm => Ok(()),
        }
    }

    fn check_go(&self) -> Result<(), SourceError> {
        for file in &self.files {
            let text = String::from_utf8_lossy(&file.bytes);
            match wasmless_artifact::go_package(&text) {
                Some("handlers") => {}
                Some(found) => {
                    return Err(SourceError::WrongPackage {
                        file: file.name.clone(),
                        found: found.into(),
                    });
                }
                None => return Err(SourceError::NoPackage(file.name.clone())),
            }
        }
        let has_handler = self.files.iter().any(|f| {
            let text = String::from_utf8_lossy(&f.bytes);
            text.lines().any(|line| {
                let line = line.trim_start();
                line.strip_prefix("func")
                    .is_some_and(|rest| rest.trim_start().starts_with("Handler("))
                    || line.starts_with("var Handler") // a handler assigned from a function value
            })
        });
        if has_handler {
            Ok(())
        } else {
            Err(SourceError::NoGoHandler)
        }
    }

    fn check_rust(&self) -> Result<(), SourceError> {
        let has_handler = self.files.iter().any(|f| {
            let text = String::from_utf8_lossy(&f.bytes);
            text.lines().any(|line| {
                let line = line.trim_start();
                let line = line.strip_prefix("pub").map_or(line, str::trim_start);
                let line = line.strip_prefix("(crate)").map_or(line, str::trim_start);
                line.strip_prefix("fn").is_some_and(|rest| {
                    let rest = rest.trim_start();
                    rest.starts_with("handler(") || rest.starts_with("handler (")
                })
            })
        });
        if has_handler {
            Ok(())
        } else {
            Err(SourceError::NoRustHandler)
        }
    }
}

#[cfg(test)]
mod tests;
