//! Compiled code: wasmtime's precompiled form of a module, made once by the builder so that
//! a new pod compiles nothing.
//!
//! The decompressed artifact is a small text header and the `.cwasm` bytes:
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
//! Stored, it is LZ4 in independent blocks of 1 MiB (decompressed), so that a new pod
//! decompresses them on every core it has: one 12 MB block took ~7.5 ms on one core, the
//! long pole of its start.
//!
//! ```text
//! \x89WLB                       magic (as a little-endian size, beyond MAX_CODE_BYTES)
//! u32 LE                        decompressed size
//! u32 LE                        block size, decompressed (the last block may be shorter)
//! u32 LE                        block count
//! block count × u32 LE          each block's compressed size
//! the blocks, one after another
//! ```
//!
//! Artifacts of the first builders with compiled code are one LZ4 block with its
//! decompressed size first (4 bytes, little-endian); they still load.
//!
//! Its digest is the sha256 of the **compressed** bytes: the bytes as stored (the OCI
//! layer's own digest, the chunks joined), so a reader checks them before it parses
//! anything but the block table, and before anything reads what it decompressed.
//! Compiled code is native code: it is never loaded unpinned.
//!
//! LZ4, not zstd as for modules: this is read on every new pod's start path, and LZ4
//! decompresses several times faster (the Goless sample's 12 MB of code: a few ms instead of
//! ~10), for a larger artifact (5.6 MB instead of 3.4 MB with zstd -9: 7 ConfigMaps, not 4).

use crate::Digest;

const MAGIC: &str = "wasmless-code 1";

/// Bytes of the header block; the `.cwasm` bytes start here.
pub const CODE_HEADER_BYTES: usize = 64 << 10;

/// Marks the block format (see the module's documentation).
const BLOCKS_MAGIC: [u8; 4] = *b"\x89WLB";

/// Decompressed bytes per block: a dozen blocks for the Goless sample, enough to keep
/// two to four cores busy, and large enough that LZ4 loses nothing of its ratio.
pub const CODE_BLOCK_BYTES: usize = 1 << 20;

/// Decompressed code beyond this many times its stored size is not what LZ4 makes of
/// code: a reader decompresses it only once its digest is checked, if at all.
pub const LIKELY_CODE_RATIO: usize = 16;

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
    /// The module carries files for the guest's working directory (`guest_files`), which
    /// only the module holds: a runtime loading this code reads the module too. Written
    /// only when set, so code of a module without files is what it always was.
    pub module_files: bool,
}

impl CodeHeader {
    /// The header's lines, as the header block holds them before its padding.
    pub fn to_lines(&self) -> String {
        let mut lines = format!(
            "{MAGIC}\nmodule-digest: {}\nengine: {}\nkind: {}\ntarget: {}\n",
            self.module_digest,
            self.engine,
            self.kind.name(),
            self.target
        );
        if self.module_files {
            lines.push_str("module-files: true\n");
        }
        lines
    }

    /// Reads what [`CodeHeader::to_lines`] wrote (padded or not).
    pub fn parse(lines: &str) -> Result<Self, CodeError> {
        parse_header(lines)
    }
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
    let mut plain = header.to_lines().into_bytes();
    assert!(plain.len() < CODE_HEADER_BYTES, "a header of a few lines");
    plain.resize(CODE_HEADER_BYTES, b'\n');
    plain.extend_from_slice(cwasm);
    let blocks: Vec<Vec<u8>> = plain.chunks(CODE_BLOCK_BYTES).map(lz4_flex::block::compress).collect();
    let size = u32::try_from(plain.len()).expect("code under 4 GiB");
    let mut stored = Vec::with_capacity(16 + 4 * blocks.len() + blocks.iter().map(Vec::len).sum::<usize>());
    stored.extend_from_slice(&BLOCKS_MAGIC);
    for field in [size, CODE_BLOCK_BYTES as u32, blocks.len() as u32] {
        stored.extend_from_slice(&field.to_le_bytes());
    }
    for block in &blocks {
        stored.extend_from_slice(&(block.len() as u32).to_le_bytes());
    }
    for block in &blocks {
        stored.extend_from_slice(block);
    }
    stored
}

/// One independently compressed block of an artifact: its LZ4 bytes, and where its
/// decompressed bytes go in the whole.
#[derive(Debug, Clone)]
pub struct CodeBlock<'a> {
    pub compressed: &'a [u8],
    pub decompressed: std::ops::Range<usize>,
}

/// Bytes at the start of a stored artifact that say how the rest is laid out
/// ([`code_preamble`]).
pub const CODE_PREAMBLE_BYTES: usize = 16;

/// How a stored artifact is laid out, from its first [`CODE_PREAMBLE_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodePreamble {
    /// The first format: one LZ4 block after a 4-byte size.
    OneBlock,
    /// Blocks, whose table of compressed sizes is the next `table_bytes`.
    Blocks { table_bytes: usize },
}

/// Reads the preamble (the artifact's first bytes; fewer than [`CODE_PREAMBLE_BYTES`] only
/// for an artifact that short). Reads only these bytes, so it may run on bytes whose
/// digest is still being checked.
pub fn code_preamble(first: &[u8]) -> Result<CodePreamble, CodeError> {
    let size = decoded_code_size(first)?;
    if !first.starts_with(&BLOCKS_MAGIC) {
        return Ok(CodePreamble::OneBlock);
    }
    let (block_size, count) = (table_field(first, 2)?, table_field(first, 3)?);
    if block_size == 0 || count != size.div_ceil(block_size) {
        return Err(CodeError::Decompress(format!(
            "{count} blocks of {block_size} bytes do not make {size} bytes"
        )));
    }
    Ok(CodePreamble::Blocks { table_bytes: 4 * count })
}

/// A block as its table describes it: how many stored bytes it has, and where its
/// decompressed bytes go in the whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockSpan {
    pub compressed_len: usize,
    pub decompressed: std::ops::Range<usize>,
}

/// The blocks of an artifact in the block format, from `head` alone: its preamble and
/// table, every byte before the first block. Their `decompressed` ranges cover exactly
/// [`decoded_code_size`] bytes.
pub fn code_block_spans(head: &[u8]) -> Result<Vec<BlockSpan>, CodeError> {
    let CodePreamble::Blocks { table_bytes } = code_preamble(head)? else {
        return Err(CodeError::Decompress("not in the block format".into()));
    };
    if head.len() != CODE_PREAMBLE_BYTES + table_bytes {
        return Err(truncated_table());
    }
    let (size, block_size) = (decoded_code_size(head)?, table_field(head, 2)?);
    (0..table_bytes / 4)
        .map(|index| {
            let start = index * block_size;
            Ok(BlockSpan {
                compressed_len: table_field(head, 4 + index)?,
                decompressed: start..(start + block_size).min(size),
            })
        })
        .collect()
}

fn truncated_table() -> CodeError {
    CodeError::Decompress("the block table is cut short".into())
}

/// The `index`th little-endian `u32` of the preamble and table.
fn table_field(head: &[u8], index: usize) -> Result<usize, CodeError> {
    let bytes = head.get(4 * index..4 * index + 4).ok_or_else(truncated_table)?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("4 bytes")) as usize)
}

/// The blocks of an artifact, in order; their `decompressed` ranges cover exactly
/// [`decoded_code_size`] bytes. Reads only the block table, so it may run on bytes whose
/// digest is still being checked.
pub fn code_blocks(compressed: &[u8]) -> Result<Vec<CodeBlock<'_>>, CodeError> {
    let table_bytes = match code_preamble(compressed)? {
        CodePreamble::OneBlock => {
            return Ok(vec![CodeBlock {
                compressed: &compressed[4..],
                decompressed: 0..decoded_code_size(compressed)?,
            }]);
        }
        CodePreamble::Blocks { table_bytes } => table_bytes,
    };
    // The table is in the input, so a forged count cannot make this allocate beyond it.
    let head = compressed
        .get(..CODE_PREAMBLE_BYTES + table_bytes)
        .ok_or_else(truncated_table)?;
    let mut offset = head.len();
    let mut blocks = Vec::with_capacity(table_bytes / 4);
    for span in code_block_spans(head)? {
        let end = offset
            .checked_add(span.compressed_len)
            .filter(|end| *end <= compressed.len())
            .ok_or_else(truncated_table)?;
        blocks.push(CodeBlock {
            compressed: &compressed[offset..end],
            decompressed: span.decompressed,
        });
        offset = end;
    }
    if offset != compressed.len() {
        return Err(CodeError::Decompress(format!(
            "{} bytes after the last block",
            compressed.len() - offset
        )));
    }
    Ok(blocks)
}

/// Decompresses one block into `out`, exactly its decompressed length. Bounds-checked:
/// it only writes into `out` whatever the input, so it may run on bytes whose digest is
/// still being checked.
pub fn decompress_block(block: &CodeBlock, out: &mut [u8]) -> Result<(), CodeError> {
    let written =
        lz4_flex::block::decompress_into(block.compressed, out).map_err(|e| CodeError::Decompress(e.to_string()))?;
    if written != out.len() {
        return Err(CodeError::Decompress(format!(
            "{written} bytes decompressed, {} announced",
            out.len()
        )));
    }
    Ok(())
}

/// `out`, cut where the blocks' decompressed ranges end: one slice per block.
pub fn split_for_blocks<'o>(blocks: &[CodeBlock], mut out: &'o mut [u8]) -> Vec<&'o mut [u8]> {
    let mut slices = Vec::with_capacity(blocks.len());
    for block in blocks {
        let (head, rest) = std::mem::take(&mut out).split_at_mut(block.decompressed.len());
        slices.push(head);
        out = rest;
    }
    slices
}

/// The size an artifact whose digest the caller has checked decompresses to: header block
/// and code.
pub fn decoded_code_size(compressed: &[u8]) -> Result<usize, CodeError> {
    let field = |range: std::ops::Range<usize>| -> Result<usize, CodeError> {
        let bytes: [u8; 4] = compressed
            .get(range)
            .and_then(|size| size.try_into().ok())
            .ok_or_else(|| CodeError::Decompress("shorter than its size prefix".into()))?;
        Ok(u32::from_le_bytes(bytes) as usize)
    };
    let size = if compressed.starts_with(&BLOCKS_MAGIC) {
        field(4..8)?
    } else {
        field(0..4)?
    };
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
    let blocks = code_blocks(compressed)?;
    let size = blocks.last().map_or(0, |block| block.decompressed.end);
    if out.len() != size {
        return Err(CodeError::Decompress(format!(
            "{size} bytes announced, room for {}",
            out.len()
        )));
    }
    for (block, out) in blocks.iter().zip(split_for_blocks(&blocks, out)) {
        decompress_block(block, out)?;
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
    let mut module_files = false;
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
            "module-files" => module_files = value == "true",
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
        module_files,
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
            module_files: false,
        }
    }

    #[test]
    fn code_of_a_module_with_files_says_so_and_code_without_is_unchanged() {
        let plain = encode_code(&header(), b"code");
        let with_files = encode_code(
            &CodeHeader {
                module_files: true,
                ..header()
            },
            b"code",
        );
        assert!(decode_code(&with_files).unwrap().0.module_files);
        assert!(!decode_code(&plain).unwrap().0.module_files);
        let (decoded, _) = decode_code(&plain).unwrap();
        assert!(!String::from_utf8_lossy(&decoded_bytes(&plain)).contains("module-files"));
        assert_eq!(decoded, header());
    }

    fn decoded_bytes(encoded: &[u8]) -> Vec<u8> {
        let mut plain = vec![0; decoded_code_size(encoded).unwrap()];
        decode_code_into(encoded, &mut plain).unwrap();
        plain
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
    fn code_of_several_blocks_round_trips_block_by_block() {
        // Three blocks: the header block and code, with a short last block.
        let cwasm: Vec<u8> = (0..2 * CODE_BLOCK_BYTES + 123).map(|i| (i * 7 % 251) as u8).collect();
        let encoded = encode_code(&header(), &cwasm);
        let blocks = code_blocks(&encoded).unwrap();
        assert_eq!(blocks.len(), 3);
        assert_eq!(
            blocks[2].decompressed,
            2 * CODE_BLOCK_BYTES..CODE_HEADER_BYTES + cwasm.len()
        );
        // Blocks decompress in any order, each into its own part of the whole.
        let mut plain = vec![0; decoded_code_size(&encoded).unwrap()];
        let mut outs = split_for_blocks(&blocks, &mut plain);
        for index in [2, 0, 1] {
            decompress_block(&blocks[index], outs[index]).unwrap();
            outs[index] = &mut [];
        }
        assert_eq!(code_header(&plain).unwrap(), header());
        assert_eq!(&plain[CODE_HEADER_BYTES..], cwasm);
    }

    /// What the first builders with compiled code wrote: one LZ4 block, its size first.
    #[test]
    fn code_in_one_block_still_loads() {
        let cwasm = b"\x7fELF code".to_vec();
        let plain = decode_code_plain(&encode_code(&header(), &cwasm));
        let one_block = lz4_flex::block::compress_prepend_size(&plain);
        let (decoded, bytes) = decode_code(&one_block).unwrap();
        assert_eq!((decoded, bytes), (header(), cwasm));
    }

    fn decode_code_plain(encoded: &[u8]) -> Vec<u8> {
        let mut plain = vec![0; decoded_code_size(encoded).unwrap()];
        decompress_code_into(encoded, &mut plain).unwrap();
        plain
    }

    #[test]
    fn a_block_table_that_does_not_match_its_bytes_is_refused() {
        let encoded = encode_code(&header(), &vec![7; CODE_BLOCK_BYTES]);
        let refused = |bytes: &[u8]| match decode_code(bytes) {
            Err(CodeError::Decompress(message)) => message,
            other => panic!("expected a decompression error, got {other:?}"),
        };
        assert!(refused(&encoded[..encoded.len() - 1]).contains("cut short"));
        assert!(refused(&[&encoded[..], b"x"].concat()).contains("after the last block"));
        let mut wrong_count = encoded.clone();
        wrong_count[12..16].copy_from_slice(&7u32.to_le_bytes());
        assert!(refused(&wrong_count).contains("do not make"));
        // A count the input has no table for is refused before anything is allocated for it.
        let mut tiny_blocks = encoded[..16].to_vec();
        tiny_blocks[8..12].copy_from_slice(&1u32.to_le_bytes());
        let size = u32::from_le_bytes(tiny_blocks[4..8].try_into().unwrap());
        tiny_blocks[12..16].copy_from_slice(&size.to_le_bytes());
        assert!(refused(&tiny_blocks).contains("cut short"));
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
