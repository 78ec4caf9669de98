//! A handler's source as the user wrote it, and the checks that give a one-line reason
//! before any compiler runs.

use std::path::{Path, PathBuf};
use wasmless_artifact::Digest;

/// Largest source the builder accepts, as the CRD does.
pub const MAX_SOURCE_BYTES: usize = 512 * 1024;

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
}

/// The handler's files, read once: a single file, or every file of the language in a
/// directory (sorted by name).
#[derive(Debug, Clone)]
pub struct Source {
    pub language: Language,
    pub files: Vec<SourceFile>,
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
            let entries = std::fs::read_dir(path).map_err(|source| SourceError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let mut files = Vec::new();
            for entry in entries.flatten() {
                let file = entry.path();
                if file.is_file() && file.extension().is_some_and(|ext| ext == language.extension()) {
                    files.push(SourceFile {
                        name: entry.file_name().to_string_lossy().into_owned(),
                        bytes: read(&file)?,
                    });
                }
            }
            files.sort_by(|a, b| a.name.cmp(&b.name));
            if files.is_empty() {
                return Err(SourceError::NoFiles(path.to_path_buf(), language.extension()));
            }
            files
        } else {
            let name = path
                .file_name()
                .map_or("source".into(), |n| n.to_string_lossy().into_owned());
            vec![SourceFile {
                name,
                bytes: read(path)?,
            }]
        };
        Ok(Self { language, files })
    }

    /// A single-file source held in memory (inline Function source).
    pub fn inline(language: Language, name: &str, text: impl Into<Vec<u8>>) -> Self {
        Self {
            language,
            files: vec![SourceFile {
                name: name.to_string(),
                bytes: text.into(),
            }],
        }
    }

    pub fn total_bytes(&self) -> usize {
        self.files.iter().map(|f| f.bytes.len()).sum()
    }

    /// The `sourceDigest` (docs/architecture.md), for the builder of `builder_version`. A single file
    /// hashes as its bytes alone, so the operator (which has only the inline text)
    /// computes the same digest; several files hash with their names.
    pub fn digest(&self, builder_version: &str) -> Digest {
        let canonical = match self.files.as_slice() {
            [single] => single.bytes.clone(),
            files => {
                let mut joined = Vec::new();
                for file in files {
                    for part in [file.name.as_bytes(), &file.bytes] {
                        joined.extend_from_slice(&(part.len() as u64).to_le_bytes());
                        joined.extend_from_slice(part);
                    }
                }
                joined
            }
        };
        Digest::of_source(self.language.name(), builder_version, &canonical)
    }

    /// The checks that need no compiler.
    pub fn check(&self) -> Result<(), SourceError> {
        let total = self.total_bytes();
        if total > MAX_SOURCE_BYTES {
            return Err(SourceError::TooLarge(total));
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
mod tests {
    use super::*;

    const GOLESS: &str = "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tw.Write([]byte(\"This works!\"))\n}\n";

    #[test]
    fn goless_source_passes() {
        Source::inline(Language::Go, "handler.go", GOLESS).check().unwrap();
        let commented = format!("// Copyright\n/* a\n block */\n{GOLESS}");
        Source::inline(Language::Go, "handler.go", commented).check().unwrap();
    }

    #[test]
    fn bad_sources_get_one_line_reasons() {
        let main = GOLESS.replace("package handlers", "package main");
        let error = Source::inline(Language::Go, "handler.go", main).check().unwrap_err();
        assert!(error.to_string().contains("`package main`"), "{error}");
        let error = Source::inline(Language::Go, "h.go", "package handlers\nfunc Other() {}\n")
            .check()
            .unwrap_err();
        assert!(matches!(error, SourceError::NoGoHandler));
        let error = Source::inline(Language::Rust, "h.rs", "pub fn other() {}")
            .check()
            .unwrap_err();
        assert!(matches!(error, SourceError::NoRustHandler));
        let error = Source::inline(Language::Go, "h.go", " \n\t").check().unwrap_err();
        assert!(matches!(error, SourceError::Empty));
        let huge = format!("{GOLESS}//{}\n", "x".repeat(MAX_SOURCE_BYTES));
        let error = Source::inline(Language::Go, "h.go", huge).check().unwrap_err();
        assert!(matches!(error, SourceError::TooLarge(_)));
        assert!(
            "cobol"
                .parse::<Language>()
                .unwrap_err()
                .to_string()
                .contains("use go, rust, wat or wasm")
        );
        for error in [
            SourceError::NoRustHandler.to_string(),
            SourceError::TooLarge(600_000).to_string(),
            SourceError::WrongPackage {
                file: "a.go".into(),
                found: "main".into(),
            }
            .to_string(),
        ] {
            assert!(!error.contains('\n'), "one line: {error}");
        }
    }

    #[test]
    fn rust_handler_signatures_are_found() {
        for source in [
            "pub fn handler(r: Request) -> Response {}",
            "fn handler (r: Request) -> Response {}",
            "pub(crate) fn handler(r: Request) -> Response {}",
        ] {
            Source::inline(Language::Rust, "h.rs", source).check().unwrap();
        }
    }

    #[test]
    fn single_file_digest_ignores_the_file_name() {
        let a = Source::inline(Language::Go, "handler.go", GOLESS);
        let b = Source::inline(Language::Go, "source", GOLESS);
        assert_eq!(a.digest("0.1.0"), b.digest("0.1.0"));
        assert_eq!(a.digest("0.1.0"), Digest::of_source("go", "0.1.0", GOLESS.as_bytes()));
        assert_ne!(a.digest("0.1.0"), a.digest("0.2.0"));
        assert_ne!(
            a.digest("0.1.0"),
            Source::inline(Language::Rust, "handler.go", GOLESS).digest("0.1.0")
        );
    }
}
