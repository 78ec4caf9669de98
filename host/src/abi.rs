//! Which of the three handler contracts a module speaks: read from the binary by
//! `wasmless_formats::abi` (a parser of bytes we did not write), and here from a compiled
//! module's exports.

pub use wasmless_formats::abi::{Abi, AbiError, REACTOR_HANDLE, REACTOR_REQUEST_BUFFER, detect};

/// The contract of a compiled core module (from the compiled-code cache, or the builder's
/// precompiled code), read from its exports as [`detect`] reads them from the binary.
pub fn of_module(module: &wasmtime::Module) -> Abi {
    let exported = |wanted: &str| module.get_export(wanted).is_some();
    if exported(REACTOR_HANDLE) && exported(REACTOR_REQUEST_BUFFER) && !exported("_start") {
        Abi::GoReactor
    } else {
        Abi::CgiCommand
    }
}
