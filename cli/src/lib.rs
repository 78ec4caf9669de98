//! The parts of the `wasmless` command line that read files a user hands it; the
//! commands themselves live in the binary. The parser of `function.yaml` is in
//! `wasmless-formats`, with the other formats of bytes we did not write (fuzzed there).

pub use wasmless_formats::function_file;
