//! The parts of the `wasmless` command line that read files a user hands it, as a library
//! so the fuzz targets (`fuzz/`) reach them; the commands themselves live in the binary.

pub mod function_file;
