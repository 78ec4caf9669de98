//! Go handler source, before any compiler sees it: the package clause
//! (`wasmless_artifact::go_package`) and the builder's checks (`Source::check`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_formats::source::{Language, Source};

fuzz_target!(|bytes: &[u8]| {
    let text = String::from_utf8_lossy(bytes);
    if let Some(name) = wasmless_artifact::go_package(&text) {
        // A package name is a Go identifier from a `package` clause in the source.
        assert!(!name.is_empty(), "empty package name");
        assert!(
            name.chars().all(|c| c.is_alphanumeric() || c == '_') && !name.starts_with(|c: char| c.is_ascii_digit()),
            "{name:?} is not an identifier"
        );
        assert!(text.contains(name));
    }
    let _ = Source::inline(Language::Go, "handler.go", bytes).check();
});
