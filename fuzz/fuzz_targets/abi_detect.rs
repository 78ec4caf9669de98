//! Arbitrary bytes as a handler binary: which ABI they speak (`wasmless_formats::abi::detect`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_formats::abi::{Abi, detect};

fuzz_target!(|bytes: &[u8]| {
    match detect(bytes) {
        // A component is served over wasi:http, a core module over CGI or as a Go reactor:
        // never the other way.
        Ok(Abi::HttpComponent) => assert!(wasmparser::Parser::is_component(bytes)),
        Ok(Abi::CgiCommand | Abi::GoReactor) => assert!(wasmparser::Parser::is_core_wasm(bytes)),
        Err(_) => {}
    }
});
