//! The `function.yaml` that `wasmless dev` reads (`LocalFunction::from_yaml_text`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use wasmless_formats::function_file::LocalFunction;

fuzz_target!(|text: &str| {
    if let Ok(function) = LocalFunction::from_yaml_text(text, Path::new("function.yaml")) {
        // What is read is what is built: its source passes or fails the builder's checks
        // without panicking, like any other source.
        let _ = function.source.check();
    }
});
