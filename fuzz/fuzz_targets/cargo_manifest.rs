//! A Rust handler's `Cargo.toml`, combined with the builder's crate
//! (`cargo_manifest::handler_manifest`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_formats::cargo_manifest::handler_manifest;

const BASE: &str = "[package]\nname = \"wasmless-handler\"\n\n[dependencies]\nwasmless-sdk = { path = \"wasmless-sdk\" }\n\n[profile.release]\nopt-level = \"s\"\n\n[workspace]\n";

fuzz_target!(|text: &str| {
    if let Ok(made) = handler_manifest(text, BASE, "wasmless_handler") {
        // What is accepted is a manifest cargo can read, with the builder's library and SDK.
        let table: toml::Table = made.text.parse().expect("the generated manifest parses");
        assert_eq!(table["lib"]["name"].as_str(), Some("wasmless_handler"));
        assert_eq!(table["dependencies"]["wasmless-sdk"]["path"].as_str(), Some("wasmless-sdk"));
        assert!(table.get("patch").is_none() && table.get("build-dependencies").is_none());
    }
});
