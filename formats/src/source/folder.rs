//! A handler's folder as its user lays it out: every file below it, sub-folders included,
//! but what a `.wasmlessignore` lists and what is never part of a Function (hidden files,
//! `function.yaml`, test files, build output). `wasmless dev`, `wasmless deploy` and the
//! build Job (whose `/src` is the Function's files, mounted) all read a folder this way,
//! so a Function's files are the same wherever it is built.

use crate::source::{Language, MAX_FILES, MAX_SOURCE_BYTES, Source, SourceError, SourceFile};
use std::path::{Path, PathBuf};

/// The file in a handler's folder that lists what else to leave out, a pattern a line.
pub const IGNORE_FILE: &str = ".wasmlessignore";
/// Deepest a folder's files are looked for, so a link to a folder above cannot loop.
const MAX_DEPTH: usize = 16;

/// Whether a path below a handler's folder (`/`-separated) is left out whatever the
/// `.wasmlessignore` says: a hidden file or folder (`.git`, a ConfigMap volume's `..data`),
/// the `function.yaml` the folder is deployed by, Go test files (never built), and build
/// output (`*.wasm`, its digest and code files, Cargo's `target/`).
pub fn ignored_by_default(path: &str, is_dir: bool) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    base.starts_with('.')
        || path == "function.yaml"
        || (is_dir && path == "target")
        || (!is_dir
            && (base.ends_with("_test.go")
                || base.ends_with(".wasm")
                || base.ends_with(".wasm.sha256")
                || base.ends_with(".cwasm.lz4")))
}

/// A `.wasmlessignore`: gitignore-like lines. `#` starts a comment; `name` or `*.log`
/// matches an entry of that name in any folder; a pattern with a `/` inside
/// (`data/raw/*.csv`, `/notes.txt`) matches the path from the handler's folder; a trailing
/// `/` matches folders only. `*` and `?` match within a name, `**` across folders.
#[derive(Debug, Default, Clone)]
pub struct Ignore {
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    glob: String,
    anchored: bool,
    dir_only: bool,
}

impl Ignore {
    /// The `.wasmlessignore` of `dir`, or none.
    pub fn of(dir: &Path) -> Result<Self, SourceError> {
        let path = dir.join(IGNORE_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text).map_err(|line| SourceError::IgnoreFile { path, line }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(SourceError::Read { path, source }),
        }
    }

    /// Patterns from `text`; `Err` names a line this reader does not take (a `!` negation).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut patterns = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line.starts_with('!') {
                return Err(line.to_string());
            }
            let dir_only = line.ends_with('/');
            let glob = line.trim_end_matches('/');
            let anchored = glob.contains('/');
            patterns.push(Pattern {
                glob: glob.trim_start_matches('/').to_string(),
                anchored,
                dir_only,
            });
        }
        Ok(Self { patterns })
    }

    /// Whether `path` (from the handler's folder, `/`-separated) is left out.
    pub fn ignores(&self, path: &str, is_dir: bool) -> bool {
        let base = path.rsplit('/').next().unwrap_or(path);
        ignored_by_default(path, is_dir)
            || self.patterns.iter().any(|p| {
                (is_dir || !p.dir_only)
                    && glob_matches(p.glob.as_bytes(), if p.anchored { path } else { base }.as_bytes())
            })
    }
}

fn glob_matches(glob: &[u8], text: &[u8]) -> bool {
    match glob {
        [] => text.is_empty(),
        [b'*', b'*', rest @ ..] => {
            let rest = rest.strip_prefix(b"/").unwrap_or(rest);
            (0..=text.len()).any(|i| glob_matches(rest, &text[i..]))
        }
        [b'*', rest @ ..] => (0..=text.len())
            .take_while(|i| *i == 0 || text[i - 1] != b'/')
            .any(|i| glob_matches(rest, &text[i..])),
        [b'?', rest @ ..] => text.first().is_some_and(|c| *c != b'/') && glob_matches(rest, &text[1..]),
        [c, rest @ ..] => text.first() == Some(c) && glob_matches(rest, &text[1..]),
    }
}

/// The files beside a handler in its folder `dir` that a Function holds in `files`: the
/// language's module files and, for a Go handler, every file it ships (read with
/// [`read_folder`], `.wasmlessignore` applied); not the handler's own source files.
pub fn files_beside(language: Language, dir: &Path) -> Result<Vec<SourceFile>, SourceError> {
    if language != Language::Go {
        return Source::module_files_in(language, dir);
    }
    let files = read_folder(dir, &Ignore::of(dir)?)?;
    Ok(files
        .into_iter()
        .filter(|f| !language.is_handler_file(&f.name))
        .collect())
}

/// Most files a folder holds: the handler's source and the [`MAX_FILES`] a Function's
/// `spec.files` may hold beside it.
const MAX_FOLDER_FILES: usize = MAX_FILES + 1;

/// Every file below `dir` that `ignore` keeps, by its `/`-separated path, sorted. A
/// symbolic link is followed only to somewhere inside `dir` (a ConfigMap volume's links
/// are); one that leads out is refused, as are more than [`MAX_FILES`] files or more than
/// [`MAX_SOURCE_BYTES`] of them, naming the largest, before any is read.
pub fn read_folder(dir: &Path, ignore: &Ignore) -> Result<Vec<SourceFile>, SourceError> {
    let read_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SourceError::Read { path, source }
    };
    let root = dir.canonicalize().map_err(read_error(dir))?;
    let mut found = Vec::new();
    walk(&root, &root, "", 0, ignore, &mut found)?;
    found.sort_by(|a, b| a.0.cmp(&b.0));
    if found.len() > MAX_FOLDER_FILES {
        return Err(SourceError::TooManyFiles {
            dir: dir.to_path_buf(),
            count: found.len(),
        });
    }
    let total: u64 = found.iter().map(|f| f.2).sum();
    if total > MAX_SOURCE_BYTES as u64 {
        let mut largest: Vec<&(String, PathBuf, u64)> = found.iter().collect();
        largest.sort_by_key(|file| std::cmp::Reverse(file.2));
        let named: Vec<String> = largest
            .iter()
            .take(3)
            .map(|(name, _, size)| format!("{name} ({size} bytes)"))
            .collect();
        return Err(SourceError::FolderTooLarge {
            dir: dir.to_path_buf(),
            total,
            largest: named.join(", "),
        });
    }
    found
        .into_iter()
        .map(|(name, path, _)| {
            let bytes = std::fs::read(&path).map_err(read_error(&path))?;
            // As the cluster holds them, so `dev` serves what `deploy` can send.
            if std::str::from_utf8(&bytes).is_err() {
                return Err(SourceError::NotText(path));
            }
            Ok(SourceFile { name, bytes })
        })
        .collect()
}

fn walk(
    root: &Path,
    dir: &Path,
    prefix: &str,
    depth: usize,
    ignore: &Ignore,
    found: &mut Vec<(String, PathBuf, u64)>,
) -> Result<(), SourceError> {
    let read_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SourceError::Read { path, source }
    };
    for entry in std::fs::read_dir(dir).map_err(read_error(dir))? {
        let entry = entry.map_err(read_error(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = format!("{prefix}{name}");
        // Hidden entries are never followed: a ConfigMap volume's `..data` is one.
        if name.starts_with('.') {
            continue;
        }
        let mut real = entry.path();
        let own_type = entry.file_type().map_err(read_error(&real))?;
        // Left out as it is first, so a listed link (one leading out, or broken) is never
        // followed; a link may stand for a folder, so `raw/` lists a link named raw too.
        if ignore.ignores(&path, own_type.is_dir()) || (own_type.is_symlink() && ignore.ignores(&path, true)) {
            continue;
        }
        if own_type.is_symlink() {
            let target = real.canonicalize().map_err(read_error(&real))?;
            if !target.starts_with(root) {
                return Err(SourceError::LinkOutside { link: real, target });
            }
            real = target;
        }
        let meta = std::fs::metadata(&real).map_err(read_error(&real))?;
        if ignore.ignores(&path, meta.is_dir()) {
            continue;
        }
        if meta.is_dir() {
            if depth >= MAX_DEPTH {
                return Err(SourceError::TooDeep(entry.path()));
            }
            walk(root, &real, &format!("{path}/"), depth + 1, ignore, found)?;
        } else if meta.is_file() {
            found.push((path, real, meta.len()));
            // Enough to say there are too many, without walking a huge tree to the end.
            if found.len() > MAX_FOLDER_FILES {
                return Ok(());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_gitignore_does_for_simple_patterns() {
        let ignore = Ignore::parse("# notes\n*.log\nraw/\n/notes.txt\ndata/**/*.tmp\n").unwrap();
        assert!(ignore.ignores("a.log", false));
        assert!(ignore.ignores("sub/b.log", false));
        assert!(ignore.ignores("raw", true));
        assert!(!ignore.ignores("raw", false));
        assert!(ignore.ignores("notes.txt", false));
        assert!(!ignore.ignores("sub/notes.txt", false));
        assert!(ignore.ignores("data/x/y/z.tmp", false));
        assert!(!ignore.ignores("countries.csv", false));
        assert!(Ignore::parse("!keep.log\n").is_err());
    }

    #[test]
    fn hidden_files_function_yaml_tests_and_build_output_are_left_out() {
        let ignore = Ignore::default();
        for path in [
            ".git",
            "sub/.env",
            "function.yaml",
            "handler_test.go",
            "module.wasm",
            "target",
        ] {
            assert!(ignore.ignores(path, path == "target" || path == ".git"), "{path}");
        }
        assert!(!ignore.ignores("templates/function.yaml", false));
        assert!(!ignore.ignores("handler.go", false));
    }

    #[test]
    fn a_folder_is_read_with_its_sub_folders_and_without_what_is_ignored() {
        let dir = tempfile_dir();
        std::fs::create_dir_all(dir.join("templates/partials")).unwrap();
        std::fs::write(dir.join("handler.go"), "package handlers\n").unwrap();
        std::fs::write(dir.join("templates/index.html"), "<p>").unwrap();
        std::fs::write(dir.join("templates/partials/head.html"), "<h1>").unwrap();
        std::fs::write(dir.join("notes.md"), "x").unwrap();
        std::fs::write(dir.join(IGNORE_FILE), "notes.md\n").unwrap();
        std::fs::write(dir.join("function.yaml"), "x").unwrap();
        let files = read_folder(&dir, &Ignore::of(&dir).unwrap()).unwrap();
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            ["handler.go", "templates/index.html", "templates/partials/head.html"]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_link_out_of_the_folder_is_refused_and_one_inside_is_followed() {
        let dir = tempfile_dir();
        std::fs::write(dir.join("real.csv"), "1").unwrap();
        std::os::unix::fs::symlink(dir.join("real.csv"), dir.join("alias.csv")).unwrap();
        let names: Vec<String> = read_folder(&dir, &Ignore::default())
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names, ["alias.csv", "real.csv"]);
        std::os::unix::fs::symlink("/etc", dir.join("etc")).unwrap();
        let error = read_folder(&dir, &Ignore::default()).unwrap_err();
        assert!(matches!(error, SourceError::LinkOutside { .. }), "{error}");
        assert!(error.to_string().contains("outside"), "{error}");
        // As the error says: listed, the link is left alone (a broken one too).
        std::os::unix::fs::symlink("/nowhere", dir.join("broken")).unwrap();
        std::fs::write(dir.join(IGNORE_FILE), "etc\nbroken\n").unwrap();
        let names: Vec<String> = read_folder(&dir, &Ignore::of(&dir).unwrap())
            .unwrap()
            .into_iter()
            .map(|f| f.name)
            .collect();
        assert_eq!(names, ["alias.csv", "real.csv"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_folder_holds_the_handler_and_as_many_files_as_a_function_and_text_only() {
        let dir = tempfile_dir();
        std::fs::write(dir.join("handler.go"), "package handlers\n").unwrap();
        for i in 0..MAX_FILES {
            std::fs::write(dir.join(format!("{i}.txt")), "x").unwrap();
        }
        assert_eq!(read_folder(&dir, &Ignore::default()).unwrap().len(), MAX_FILES + 1);
        std::fs::write(dir.join("one-more.txt"), "x").unwrap();
        let error = read_folder(&dir, &Ignore::default()).unwrap_err();
        assert!(matches!(error, SourceError::TooManyFiles { .. }), "{error}");
        std::fs::remove_file(dir.join("one-more.txt")).unwrap();
        std::fs::write(dir.join("0.txt"), [0xff, 0xd8, 0xff]).unwrap();
        let error = read_folder(&dir, &Ignore::default()).unwrap_err().to_string();
        assert!(
            error.contains("0.txt is not UTF-8 text") && error.contains(IGNORE_FILE),
            "{error}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_folder_too_large_names_its_largest_files() {
        let dir = tempfile_dir();
        std::fs::write(dir.join("huge.bin"), vec![b'x'; MAX_SOURCE_BYTES + 1]).unwrap();
        std::fs::write(dir.join("small.txt"), "x").unwrap();
        let error = read_folder(&dir, &Ignore::default()).unwrap_err().to_string();
        assert!(error.contains("huge.bin (524289 bytes)"), "{error}");
        assert!(error.contains(IGNORE_FILE), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn tempfile_dir() -> PathBuf {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("wasmless-folder-test-{}-{made}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
