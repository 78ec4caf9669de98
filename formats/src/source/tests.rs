//! The source's reading and checks, as a user meets them.

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

fn file(name: &str, text: &str) -> SourceFile {
    SourceFile {
        name: name.into(),
        bytes: text.into(),
    }
}

#[test]
fn module_files_count_in_the_digest_and_the_cap() {
    let go_mod = "module example.com/f\n\ngo 1.21\n\nrequire github.com/google/uuid v1.6.0\n";
    let sum = "github.com/google/uuid v1.6.0 h1:NIvaJDMOsjHA8n1jAhLSgzrAzy1Hgr+hNrb57e+94F0=\n";
    let with = |sum: &str| {
        Source::from_files(
            Language::Go,
            vec![file("go.sum", sum), file("handler.go", GOLESS), file("go.mod", go_mod)],
        )
    };
    let source = with(sum);
    source.check().unwrap();
    assert_eq!(source.files.len(), 1);
    assert_eq!(
        source.module_files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
        ["go.mod", "go.sum"]
    );
    let single = Source::inline(Language::Go, "handler.go", GOLESS).digest("1");
    assert_ne!(
        source.digest("1"),
        single,
        "go.mod and go.sum are part of what is built"
    );
    assert_ne!(
        source.digest("1"),
        with(&sum.replace("NIv", "XIv")).digest("1"),
        "a changed go.sum builds again"
    );
    // The order the files come in does not matter: the operator and the builder list them differently.
    let reordered = Source::from_files(
        Language::Go,
        vec![file("go.mod", go_mod), file("handler.go", GOLESS), file("go.sum", sum)],
    );
    assert_eq!(reordered.digest("1"), source.digest("1"));

    let huge = with(&"x".repeat(MAX_SOURCE_BYTES));
    assert!(
        matches!(huge.check(), Err(SourceError::TooLarge(_))),
        "the cap covers every file"
    );
    let no_mod = Source::from_files(Language::Go, vec![file("handler.go", GOLESS), file("go.sum", sum)]);
    assert!(matches!(no_mod.check(), Err(SourceError::GoSumWithoutGoMod)));
    let cargo = |files: &[&str]| {
        let mut all = vec![file("lib.rs", "pub fn handler(r: Request) -> Response {}")];
        all.extend(files.iter().map(|name| file(name, "[dependencies]\n")));
        Source::from_files(Language::Rust, all)
    };
    let with_lock = cargo(&["Cargo.toml", "Cargo.lock"]);
    with_lock.check().unwrap();
    assert_eq!(
        with_lock.module_files.len(),
        2,
        "Cargo.toml and Cargo.lock are module files"
    );
    assert!(matches!(
        cargo(&["Cargo.lock"]).check(),
        Err(SourceError::CargoLockWithoutCargoToml)
    ));
}

#[test]
fn a_directory_brings_its_module_files() {
    let dir = std::env::temp_dir().join(format!("wasmless-source-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("handler.go"), GOLESS).unwrap();
    std::fs::write(dir.join("go.mod"), "module example.com/f\n").unwrap();
    std::fs::write(dir.join("README.md"), "shipped").unwrap();
    let source = Source::read(Language::Go, &dir).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(source.files.len(), 1);
    assert_eq!(source.data_files[0].name, "README.md");
    assert_eq!(source.module_files.len(), 1);
    assert_eq!(source.module_files[0].name, "go.mod");
    source.check().unwrap();
}

#[test]
fn a_cargo_package_is_read_as_flat_files() {
    let dir = tempfile_dir("cargo");
    std::fs::create_dir_all(dir.join("src/bin")).unwrap();
    std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"f\"\n").unwrap();
    std::fs::write(dir.join("Cargo.lock"), "version = 4\n").unwrap();
    std::fs::write(
        dir.join("src/lib.rs"),
        "mod util;\npub fn handler(r: Request) -> Response {}\n",
    )
    .unwrap();
    std::fs::write(dir.join("src/util.rs"), "pub fn f() {}\n").unwrap();
    std::fs::write(dir.join("src/bin/local.rs"), "fn main() {}\n").unwrap();
    std::fs::write(dir.join("README.md"), "not built").unwrap();
    let source = Source::read(Language::Rust, &dir).unwrap();
    let names = |files: &[SourceFile]| files.iter().map(|f| f.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&source.files), ["lib.rs", "util.rs"]);
    assert_eq!(names(&source.module_files), ["Cargo.lock", "Cargo.toml"]);
    source.check().unwrap();

    std::fs::create_dir_all(dir.join("src/routes")).unwrap();
    std::fs::write(dir.join("src/routes/mod.rs"), "").unwrap();
    let error = Source::read(Language::Rust, &dir).unwrap_err().to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        error.contains("src/routes") && error.contains("files directly in src/"),
        "{error}"
    );
}

fn tempfile_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wasmless-source-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}
