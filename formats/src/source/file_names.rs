//! What may name a file of a handler's source: the rule a Function's `spec.files` keys and
//! a folder's files are held to.

use super::{Language, MAX_FILE_NAME_BYTES};

/// First folders of a Go module's root that the builder writes itself (the generated
/// `main`, the SDK): no file of a handler may be in them.
const GO_RESERVED_FOLDERS: [&str; 2] = ["wasmless_main", "wasmless-sdk"];
/// What `go build` compiles, or refuses without cgo, when it lies in a package's directory.
const GO_BUILT_EXTENSIONS: [&str; 19] = [
    "c", "h", "s", "S", "sx", "syso", "cc", "cpp", "cxx", "hh", "hpp", "hxx", "m", "f", "F", "for", "f90", "swig",
    "swigcxx",
];

/// Why `name` cannot name one of a source's files in `language`, in words for a person;
/// `None` when it can. A name is a path from the handler's folder (`countries.csv`,
/// `templates/index.html`): letters, digits, `.`, `_` and `-`, folders separated by `/`,
/// no empty, `.` or `..` segment, none starting with `.`, at most [`MAX_FILE_NAME_BYTES`]
/// ([`wasmless_artifact::guest_files::path_problem`]), and nothing a folder's read leaves
/// out ([`super::folder::ignored_by_default`]), so a Function holds what `wasmless deploy`
/// would read from its folder. Directly in the folder: the language's
/// [`Language::module_file_names`] and its source files (`.go` but not `_test.go`, `.rs`);
/// anything else is a data file the Go handler ships (embedded with `//go:embed`, read at
/// run time in its working directory). The files of a Function become files in the build's
/// directory and in the guest's: nothing else may reach either.
pub fn file_name_problem(language: Language, name: &str) -> Option<String> {
    let shown: String = name.chars().take(MAX_FILE_NAME_BYTES + 1).collect();
    let refused = |why: &str| Some(format!("file name {shown:?} is not allowed: {why}"));
    if let Some(problem) = wasmless_artifact::guest_files::path_problem(name) {
        return refused(problem);
    }
    if name.len() > MAX_FILE_NAME_BYTES {
        return refused(&format!("it is over {MAX_FILE_NAME_BYTES} characters"));
    }
    // Never inside a name either: the operator writes a folder's `/` as `..` in a key.
    if name.contains("..") {
        return refused("it holds '..'");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'/'))
    {
        return refused("use letters, digits, '.', '_' and '-', and '/' between folders");
    }
    if super::folder::ignored_by_default(name, false) {
        return refused(
            "it is one a folder's read leaves out (function.yaml, _test.go, *.wasm): rename it, or leave it out",
        );
    }
    if language.module_file_names().contains(&name) || language.is_handler_file(name) {
        return None;
    }
    match language {
        Language::Go => {
            let first = name.split('/').next().unwrap_or_default();
            // Any case: on a case-insensitive disk (a Mac's, under `wasmless dev`) it is the folder.
            if GO_RESERVED_FOLDERS
                .iter()
                .any(|reserved| reserved.eq_ignore_ascii_case(first))
            {
                return refused(&format!(
                    "{first} is where the builder writes its own code: use another name"
                ));
            }
            // Beside the handler's .go files, `go build` would compile these too (or refuse them).
            let extension = name.rsplit_once('.').map(|(_, extension)| extension);
            if !name.contains('/') && extension.is_some_and(|extension| GO_BUILT_EXTENSIONS.contains(&extension)) {
                return refused(
                    "beside the handler's .go files Go would build it (C, assembly, .syso): put it in a folder (data/), or leave it out",
                );
            }
            if matches!(name, "go.work" | "go.work.sum") {
                return refused("a handler builds as its own module, not a workspace: leave go.work out");
            }
            None
        }
        Language::Rust => refused(
            "a Rust handler's files are its .rs files, Cargo.toml and Cargo.lock; data files beside the handler are for Go handlers (include_str! the data into a .rs file instead)",
        ),
        Language::Wat | Language::Wasm => Some(format!(
            "file {shown:?}: language {} takes no files beside its source",
            language.name()
        )),
    }
}

/// Two names of one source that differ only by case (`A.txt`, `a.txt`), in words for a
/// person: on a case-insensitive disk (a Mac's, under `wasmless dev`) they are one file, so
/// the Function would not be the same there and on the cluster.
pub fn case_clash<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut seen = std::collections::BTreeMap::new();
    for name in names {
        if let Some(other) = seen.insert(name.to_ascii_lowercase(), name)
            && other != name
        {
            return Some(format!(
                "file names {other:?} and {name:?} differ only by case, which a case-insensitive disk takes for one file: rename one"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::{Source, SourceError, SourceFile};
    use super::*;

    const GOLESS: &str =
        "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {}\n";

    fn file(name: &str, text: &str) -> SourceFile {
        SourceFile {
            name: name.into(),
            bytes: text.into(),
        }
    }

    #[test]
    fn file_names_are_paths_from_the_handlers_folder() {
        let go_names = [
            "go.mod",
            "go.sum",
            "routes.go",
            "a-b_c.v2.go",
            "countries.csv",
            "templates/index.html",
            "static/css/site.css",
            "sub/x.go",
            "Cargo.toml",
        ];
        for name in go_names {
            assert_eq!(file_name_problem(Language::Go, name), None, "{name}");
        }
        assert_eq!(file_name_problem(Language::Rust, "Cargo.toml"), None);
        assert_eq!(file_name_problem(Language::Rust, "Cargo.lock"), None);
        assert_eq!(file_name_problem(Language::Rust, "util.rs"), None);
        let refused = [
            ("../handler.go", ".. segment"),
            ("templates/../../x", ".. segment"),
            ("/etc/passwd", "absolute"),
            ("a//b.csv", "empty segment"),
            ("templates/", "empty segment"),
            ("", "empty"),
            ("..go", "starts with '.'"),
            (".hidden.go", "starts with '.'"),
            ("static/.env", "starts with '.'"),
            ("a..b.go", "'..'"),
            ("go.mod ", "letters, digits"),
            ("x_test.go", "leaves out"),
            ("function.yaml", "leaves out"),
            ("module.wasm", "leaves out"),
            ("wasmless_main/main.go", "the builder writes its own code"),
            ("wasmless-sdk/go.mod", "the builder writes its own code"),
            ("go.work", "workspace"),
        ];
        for (name, why) in refused {
            let problem = file_name_problem(Language::Go, name).expect(name);
            assert!(problem.contains(why), "{name}: {problem}");
        }
        assert!(
            file_name_problem(Language::Rust, "go.mod")
                .unwrap()
                .contains("for Go handlers")
        );
        assert!(
            file_name_problem(Language::Rust, "notes.txt")
                .unwrap()
                .contains("for Go handlers")
        );
        assert!(
            file_name_problem(Language::Wat, "x.wat")
                .unwrap()
                .contains("takes no files")
        );
        let long = format!("{}.go", "a".repeat(MAX_FILE_NAME_BYTES));
        assert!(file_name_problem(Language::Go, &long).is_some());
        let bad = Source::from_files(Language::Go, vec![file("handler.go", GOLESS), file("../x.go", GOLESS)]);
        assert!(matches!(bad.check(), Err(SourceError::FileName(_))));
    }

    #[test]
    fn a_go_handlers_other_files_are_data_it_ships() {
        let source = Source::from_files(
            Language::Go,
            vec![
                file("handler.go", GOLESS),
                file("templates/index.html", "<p>"),
                file("countries.csv", "fr"),
            ],
        );
        source.check().unwrap();
        assert_eq!(source.files.len(), 1);
        let shipped: Vec<&str> = source.data_files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(shipped, ["countries.csv", "templates/index.html"]);
        assert_eq!(source.all_files().count(), 3, "every file is in the digest");
    }

    #[test]
    fn names_the_builder_uses_or_go_would_build_are_refused_in_any_case() {
        for name in [
            "wasmless_main",
            "Wasmless_Main/x.go",
            "wasmless-sdk",
            "WASMLESS-SDK/go.mod",
        ] {
            let problem = file_name_problem(Language::Go, name).unwrap_or_default();
            assert!(problem.contains("the builder writes its own code"), "{name}: {problem}");
        }
        for name in ["helper.c", "asm.s", "blob.syso", "lib.h"] {
            let problem = file_name_problem(Language::Go, name).unwrap_or_default();
            assert!(problem.contains("Go would build it"), "{name}: {problem}");
        }
        assert_eq!(file_name_problem(Language::Go, "data/helper.c"), None);
        assert_eq!(file_name_problem(Language::Go, "countries.csv"), None);
    }

    #[test]
    fn names_that_differ_only_by_case_clash() {
        let clash = case_clash(["A.txt", "b.txt", "a.txt"]).unwrap();
        assert!(clash.contains("\"A.txt\" and \"a.txt\""), "{clash}");
        assert_eq!(case_clash(["a.txt", "b.txt", "data/a.txt"]), None);
    }
}
