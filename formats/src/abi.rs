//! Which of the three handler contracts a binary speaks, read from the binary itself
//! (the runtime reads the same from a compiled module's exports: `wasmless_host::abi`).

use wasmparser::{Parser, Payload};

/// Export a component must have to be served over `wasi:http`.
const INCOMING_HANDLER: &str = "wasi:http/incoming-handler@0.2";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// A component exporting `wasi:http/incoming-handler`.
    HttpComponent,
    /// A WASI preview1 command (`_start`) that speaks CGI on stdin/stdout.
    CgiCommand,
    /// A WASI preview1 reactor built with the Go SDK (`wasmless.io/wasmless/reactor`),
    /// normally snapshotted after `_initialize`: [`REACTOR_HANDLE`] takes one request in
    /// the SDK's binary encoding (see [`crate::reactor_response`]).
    GoReactor,
}

/// The reactor's request entry, and the export that hands out the buffer the request is
/// written into.
pub const REACTOR_HANDLE: &str = "wasmless_handle";
pub const REACTOR_REQUEST_BUFFER: &str = "wasmless_request_buffer";

impl Abi {
    pub fn name(self) -> &'static str {
        match self {
            Self::HttpComponent => "wasi-http",
            Self::CgiCommand => "cgi",
            Self::GoReactor => "go-reactor",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AbiError {
    #[error("this is WebAssembly text, not a binary: build it first (wasmless-builder build --language wat)")]
    Text,
    #[error("not a WebAssembly module: it starts with {0:02x?}, not \\0asm")]
    NotWasm(Vec<u8>),
    #[error("the WebAssembly binary does not parse: {0}")]
    Malformed(String),
    #[error(
        "the component does not export {INCOMING_HANDLER}.x (it exports: {0}); build it with the wasmless SDK for wasm32-wasip2"
    )]
    NoIncomingHandler(String),
    #[error(
        "the core module is neither a WASI command (no _start export) nor a Wasmless reactor (no wasmless_handle and wasmless_request_buffer exports); it exports: {0}; build it with GOOS=wasip1 or for wasm32-wasip1"
    )]
    NoStart(String),
}

pub fn detect(bytes: &[u8]) -> Result<Abi, AbiError> {
    if !bytes.starts_with(b"\0asm") {
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]);
        if text.trim_start().starts_with("(module") || text.trim_start().starts_with("(component") {
            return Err(AbiError::Text);
        }
        return Err(AbiError::NotWasm(bytes[..bytes.len().min(8)].to_vec()));
    }
    let is_component = Parser::is_component(bytes);
    let exports = top_level_exports(bytes)?;
    let listed = || {
        if exports.is_empty() {
            "nothing".to_string()
        } else {
            exports.join(", ")
        }
    };
    if is_component {
        if exports.iter().any(|name| name.starts_with(INCOMING_HANDLER)) {
            return Ok(Abi::HttpComponent);
        }
        return Err(AbiError::NoIncomingHandler(listed()));
    }
    let exported = |wanted: &str| exports.iter().any(|name| name == wanted);
    // A reactor first: a Go command may export functions too, but only the reactor SDK
    // exports both of these, and a reactor has no `_start`.
    if exported(REACTOR_HANDLE) && exported(REACTOR_REQUEST_BUFFER) && !exported("_start") {
        return Ok(Abi::GoReactor);
    }
    if exported("_start") {
        return Ok(Abi::CgiCommand);
    }
    Err(AbiError::NoStart(listed()))
}

/// Export names of the outermost module or component, skipping nested ones.
fn top_level_exports(bytes: &[u8]) -> Result<Vec<String>, AbiError> {
    let malformed = |e: wasmparser::BinaryReaderError| AbiError::Malformed(e.to_string());
    let mut depth = 0usize;
    let mut names = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(malformed)? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ExportSection(reader) if depth == 1 => {
                for export in reader {
                    names.push(export.map_err(malformed)?.name.to_string());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    names.push(export.map_err(malformed)?.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_garbage_are_named() {
        assert_eq!(detect(b"(module)"), Err(AbiError::Text));
        assert!(matches!(detect(b"#!/bin/sh\necho hi"), Err(AbiError::NotWasm(_))));
        assert!(matches!(detect(b"\0asm\x01\0\0\0\x99"), Err(AbiError::Malformed(_))));
    }

    #[test]
    fn core_module_needs_start() {
        // (module (func (export "_start")))
        let command =
            b"\0asm\x01\0\0\0\x01\x04\x01\x60\0\0\x03\x02\x01\0\x07\x0a\x01\x06_start\0\0\x0a\x04\x01\x02\0\x0b";
        assert_eq!(detect(command), Ok(Abi::CgiCommand));
        let reactor = wat::parse_str(
            r#"(module (memory (export "memory") 1)
                (func (export "wasmless_request_buffer") (param i32) (result i32) i32.const 0)
                (func (export "wasmless_handle") (result i64) i64.const 0))"#,
        )
        .unwrap();
        assert_eq!(detect(&reactor), Ok(Abi::GoReactor));
        let empty = b"\0asm\x01\0\0\0";
        assert_eq!(detect(empty), Err(AbiError::NoStart("nothing".into())));
    }
}
