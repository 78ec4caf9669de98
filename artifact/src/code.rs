//! Compiled code: wasmtime's precompiled form of a module, made once by the builder so that
//! a new pod compiles nothing.
//!
//! The artifact is one LZ4 block (its uncompressed size first, 4 bytes little-endian) of a
//! small text header and the `.cwasm` bytes:
//!
//! ```text
//! wasmless-code 1
//! module-digest: sha256:<hex>   the module it was compiled from
//! engine: <64 hex>              sha256 over wasmtime's precompile compatibility hash
//! kind: module | component
//! target: x86-64-v3             the CPU feature level it needs
//!
//! <newlines up to 64 KiB>
//! <.cwasm bytes>
//! ```
//!
//! The header fills a 64 KiB block (the largest page size Linux uses), so a reader that
//! decompresses into page-aligned memory has the code page-aligned too, and wasmtime can
//! run it where it lies instead of copying 10+ MB again.
//!
//! Its digest is the sha256 of the **compressed** bytes: the bytes as stored (the OCI
//! layer's own digest, the chunks joined), so a reader checks them before it decompresses
//! or parses anything. Compiled code is native code: it is never loaded unpinned.
//!
//! LZ4, not zstd as for modules: this is read on every new pod's start path, and LZ4
//! decompresses several times faster (the Goless sample's 12 MB of code: a few ms instead of
//! ~10), for a larger artifact (5.6 MB instead of 3.4 MB with zstd -9: 7 ConfigMaps, not 4).

use crate::Digest;

const MAGIC: &str = "wasmless-code 1";

/// Bytes of the header block; the `.cwasm` bytes start here.
pub const CODE_HEADER_BYTES: usize = 64 << 10;

/// Largest `.cwasm` a reader decompresses, so a crafted stream cannot make it allocate
/// without bound. Compiled code is a few times the module's size.
pub const MAX_CODE_BYTES: u64 = 1 << 30;

/// What the header says about the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeHeader {
    /// The module the code was compiled from.
    pub module_digest: Digest,
    /// Hex sha256 over `Engine::precompile_compatibility_hash()` of the engine that
    /// compiled it: equal means the runtime's engine can load it.
    pub engine: String,
    pub kind: CodeKind,
    /// The CPU feature level the code was compiled for (`x86-64-v3`, `aarch64`).
    pub target: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeKind {
    /// A core module (the CGI command ABI).
    Module,
    /// A component (`wasi:http/proxy`).
    Component,
}

impl CodeKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Module => "module",
            Self::Component => "component",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("the compiled code does not decompress as LZ4: {0}")]
    Decompress(String),
    #[error("the compiled code decompresses to more than {MAX_CODE_BYTES} bytes")]
    TooLarge,
    #[error("not wasmless compiled code (no \"{MAGIC}\" header): rebuild the function with this builder")]
    NotCode,
    #[error("the compiled code's header is malformed: {0}")]
    Header(String),
}

/// Writes the artifact: the header block and the `.cwasm` bytes, LZ4-compressed.
pub fn encode_code(header: &CodeHeader, cwasm: &[u8]) -> Vec<u8> {
    let mut plain = format!(
        "{MAGIC}\nmodule-digest: {}\nengine: {}\nkind: {}\ntarget: {}\n",
        header.module_digest,
        header.engine,
        header.kind.name(),
        header.target
    )
    .into_bytes();
    assert!(plain.len() < CODE_HEADER_BYTES, "a header of a few lines");
    plain.resize(CODE_HEADER_BYTES, b'\n');
    plain.extend_from_slice(cwasm);
    lz4_flex::block::compress_prepend_size(&plain)
}

/// The size an artifact whose digest the caller has checked decompresses to: header block
/// and code.
pub fn decoded_code_size(compressed: &[u8]) -> Result<usize, CodeError> {
    let size: [u8; 4] = compressed
        .get(..4)
        .and_then(|size| size.try_into().ok())
        .ok_or_else(|| CodeError::Decompress("shorter than its size prefix".into()))?;
    let size = u32::from_le_bytes(size) as usize;
    if size as u64 > MAX_CODE_BYTES {
        return Err(CodeError::TooLarge);
    }
    if size <= CODE_HEADER_BYTES {
        return Err(CodeError::NotCode);
    }
    Ok(size)
}

/// Decompresses an artifact whose digest the caller has checked into `out`, exactly
/// [`decoded_code_size`] bytes; returns its header. The `.cwasm` bytes are
/// `out[CODE_HEADER_BYTES..]`.
pub fn decode_code_into(compressed: &[u8], out: &mut [u8]) -> Result<CodeHeader, CodeError> {
    decompress_code_into(compressed, out)?;
    code_header(out)
}

/// The LZ4 step of [`decode_code_into`] alone: bounds-checked, it only writes into `out`
/// whatever the input, so it may run on bytes whose digest is still being checked.
pub fn decompress_code_into(compressed: &[u8], out: &mut [u8]) -> Result<(), CodeError> {
    let stream = compressed
        .get(4..)
        .ok_or_else(|| CodeError::Decompress("shorter than its size prefix".into()))?;
    let written = lz4_flex::block::decompress_into(stream, out).map_err(|e| CodeError::Decompress(e.to_string()))?;
    if written != out.len() {
        return Err(CodeError::Decompress(format!(
            "{written} bytes decompressed, {} announced",
            out.len()
        )));
    }
    Ok(())
}

/// The header of decompressed code (what [`decompress_code_into`] wrote).
pub fn code_header(decompressed: &[u8]) -> Result<CodeHeader, CodeError> {
    let block = decompressed.get(..CODE_HEADER_BYTES).ok_or(CodeError::NotCode)?;
    let header = std::str::from_utf8(block).map_err(|_| CodeError::NotCode)?;
    parse_header(header)
}

/// [`decode_code_into`] a new buffer: the header and the `.cwasm` bytes.
pub fn decode_code(compressed: &[u8]) -> Result<(CodeHeader, Vec<u8>), CodeError> {
    let mut plain = vec![0; decoded_code_size(compressed)?];
    let header = decode_code_into(compressed, &mut plain)?;
    Ok((header, plain.split_off(CODE_HEADER_BYTES)))
}

/// Reads the header block: its lines, then the newlines `encode_code` pads it with.
fn parse_header(block: &str) -> Result<CodeHeader, CodeError> {
    if block.split('\n').next() != Some(MAGIC) {
        return Err(CodeError::NotCode);
    }
    // Without a newline at its end, the last line ran into the code: the block was cut.
    if !block.ends_with('\n') {
        return Err(CodeError::Header(format!(
            "the header does not end within its {CODE_HEADER_BYTES}-byte block"
        )));
    }
    let (mut module_digest, mut engine, mut kind, mut target) = (None, None, None, None);
    for line in block.trim_end_matches('\n').split('\n').skip(1) {
        // Values end up in logs and errors; the writer only writes text.
        if line.contains(char::is_control) {
            return Err(CodeError::Header(format!("line {line:?} has a control character")));
        }
        let (key, value) = line
            .split_once(": ")
            .ok_or_else(|| CodeError::Header(format!("line {line:?} is not `key: value`")))?;
        match key {
            "module-digest" => {
                module_digest = Some(
                    value
                        .parse::<Digest>()
                        .map_err(|e| CodeError::Header(format!("module-digest: {e}")))?,
                )
            }
            "engine" => engine = Some(value.to_string()),
            "kind" => {
                kind = Some(match value {
                    "module" => CodeKind::Module,
                    "component" => CodeKind::Component,
                    other => return Err(CodeError::Header(format!("kind {other:?} is not module or component"))),
                })
            }
            "target" => target = Some(value.to_string()),
            // Keys a newer builder adds are ignored: the engine hash decides compatibility.
            _ => {}
        }
    }
    let missing = |key: &str| CodeError::Header(format!("no {key}"));
    Ok(CodeHeader {
        module_digest: module_digest.ok_or_else(|| missing("module-digest"))?,
        engine: engine.ok_or_else(|| missing("engine"))?,
        kind: kind.ok_or_else(|| missing("kind"))?,
        target: target.ok_or_else(|| missing("target"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> CodeHeader {
        CodeHeader {
            module_digest: Digest::of(b"module"),
            engine: "ab".repeat(32),
            kind: CodeKind::Component,
            target: "x86-64-v3".into(),
        }
    }

    #[test]
    fn code_round_trips_with_its_header() {
        let cwasm = b"\n\x7fELF and then some code\n\n with blank lines".to_vec();
        let encoded = encode_code(&header(), &cwasm);
        let (decoded, bytes) = decode_code(&encoded).unwrap();
        assert_eq!(decoded, header());
        assert_eq!(bytes, cwasm);
        assert_eq!(decoded_code_size(&encoded).unwrap(), CODE_HEADER_BYTES + cwasm.len());
    }

    #[test]
    fn other_bytes_are_not_code() {
        let module = lz4_flex::block::compress_prepend_size(b"\0asm\x01\0\0\0");
        assert!(matches!(decode_code(&module), Err(CodeError::NotCode)));
        let mut not_code = vec![b'x'; CODE_HEADER_BYTES + 10];
        not_code[..4].copy_from_slice(b"\0asm");
        let not_code = lz4_flex::block::compress_prepend_size(&not_code);
        assert!(matches!(decode_code(&not_code), Err(CodeError::NotCode)));
        assert!(matches!(decode_code(b"not lz4"), Err(CodeError::Decompress(_))));
        assert!(matches!(decode_code(b"\xff\xff\xff\xffhuge"), Err(CodeError::TooLarge)));
        let mut no_kind = b"wasmless-code 1\nengine: x\n".to_vec();
        no_kind.resize(CODE_HEADER_BYTES + 4, b'\n');
        let no_kind = lz4_flex::block::compress_prepend_size(&no_kind);
        let error = decode_code(&no_kind).unwrap_err().to_string();
        assert!(error.contains("no module-digest"), "{error}");
    }

    /// Found by the `code` fuzz target: a header block with no newline at its end (its last
    /// value running to the code), or with control characters in a value, was accepted, as a
    /// header `encode_code` cannot write.
    #[test]
    fn a_header_ends_within_its_block_and_its_values_are_text() {
        let lines = format!(
            "{MAGIC}\nmodule-digest: {}\nengine: {}\nkind: module\ntarget: ",
            Digest::of(b"module"),
            "ab".repeat(32)
        );
        let mut unterminated = lines.clone().into_bytes();
        unterminated.resize(CODE_HEADER_BYTES, b'\0');
        unterminated.extend_from_slice(b"code");
        let error = decode_code(&lz4_flex::block::compress_prepend_size(&unterminated)).unwrap_err();
        assert!(error.to_string().contains("does not end"), "{error}");

        for value in ["x86\0", "x86\r", "x86\x1b[31m"] {
            let mut control = format!("{lines}{value}\n").into_bytes();
            control.resize(CODE_HEADER_BYTES, b'\n');
            control.extend_from_slice(b"code");
            let error = decode_code(&lz4_flex::block::compress_prepend_size(&control)).unwrap_err();
            assert!(error.to_string().contains("control character"), "{value:?}: {error}");
        }
    }
}
