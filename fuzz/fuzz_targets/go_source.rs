//! Go handler source, before any compiler sees it: the package clause
//! (`wasmless_artifact::go_package`), the builder's checks (`Source::check`), and a
//! Function's several files (`spec.files`: names the user chose, `go.mod`, `go.sum`, data
//! files in folders). The input is the handler, then `\0`-separated files, each
//! `name\ncontent`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_formats::source::{Language, Source, SourceFile, file_name_problem};

fuzz_target!(|bytes: &[u8]| {
    let mut parts = bytes.split(|b| *b == 0);
    let handler = parts.next().unwrap_or_default();
    let text = String::from_utf8_lossy(handler);
    if let Some(name) = wasmless_artifact::go_package(&text) {
        // A package name is a Go identifier from a `package` clause in the source.
        assert!(!name.is_empty(), "empty package name");
        assert!(
            name.chars().all(|c| c.is_alphanumeric() || c == '_') && !name.starts_with(|c: char| c.is_ascii_digit()),
            "{name:?} is not an identifier"
        );
        assert!(text.contains(name));
    }
    let _ = Source::inline(Language::Go, "handler.go", handler).check();

    let mut files = vec![SourceFile {
        name: "handler.go".into(),
        bytes: handler.to_vec(),
    }];
    for part in parts {
        let (name, content) = match part.iter().position(|b| *b == b'\n') {
            Some(at) => (&part[..at], &part[at + 1..]),
            None => (part, &[][..]),
        };
        let name = String::from_utf8_lossy(name).into_owned();
        if file_name_problem(Language::Go, &name).is_none() {
            // What becomes a ConfigMap key (`/` written `..`) and a file below the build's
            // directory and the guest's: never one that leaves them, or is hidden.
            assert!(!name.contains("..") && !name.starts_with('/') && !name.ends_with('/'), "{name:?}");
            assert!(name.split('/').all(|segment| !segment.is_empty() && !segment.starts_with('.')), "{name:?}");
            assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b)), "{name:?}");
            assert!(wasmless_artifact::guest_files::path_problem(&name).is_none(), "{name:?}");
        }
        files.push(SourceFile {
            name,
            bytes: content.to_vec(),
        });
    }
    let count = files.len();
    let source = Source::from_files(Language::Go, files);
    assert_eq!(source.all_files().count(), count);
    let checked = source.check();
    if checked.is_ok() {
        assert!(source.total_bytes() <= wasmless_formats::source::MAX_SOURCE_BYTES);
        assert!(source.files.iter().any(|f| f.name.ends_with(".go")));
    }
    let _ = source.digest("fuzz");
});
