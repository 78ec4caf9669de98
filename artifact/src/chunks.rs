//! How a module is stored in ConfigMaps: zstd-compressed, split into chunks of at most
//! 900 KiB, named by the source digest; and read back, bounded, from chunks or chunk files.

use std::io::Read;

/// A ConfigMap holds at most 1 MiB; 900 KiB leaves room for keys, labels and annotations.
pub const MAX_CHUNK_BYTES: usize = 900 * 1024;

/// Largest module the format accepts once decompressed, so a crafted chunk set cannot
/// make a reader allocate without bound.
pub const MAX_MODULE_BYTES: u64 = 256 * 1024 * 1024;

/// zstd's default level. A build publishes what it compresses at once: on a 6.7 MB Go module
/// level 19 took 2.3 s for 1.28 MB, level 3 takes 0.04 s for 1.57 MB, the same two chunks,
/// and reading either back is as fast.
const ZSTD_LEVEL: i32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("no chunks to reassemble")]
    Empty,
    #[error("chunk {index} is {size} bytes, over the {MAX_CHUNK_BYTES}-byte limit")]
    TooLarge { index: usize, size: usize },
    #[error("the chunks do not decompress as one zstd stream (a chunk missing or out of order?): {0}")]
    Decompress(std::io::Error),
    #[error("the module decompresses to more than {MAX_MODULE_BYTES} bytes")]
    ModuleTooLarge,
}

/// Compresses a module with zstd and splits the compressed stream into chunks of at
/// most [`MAX_CHUNK_BYTES`], in order.
pub fn compress_and_split(wasm: &[u8]) -> Vec<Vec<u8>> {
    split_chunks(&zstd::bulk::compress(wasm, ZSTD_LEVEL).expect("zstd compression of an in-memory buffer"))
}

/// Splits stored bytes (a compressed stream) into chunks of at most [`MAX_CHUNK_BYTES`].
pub fn split_chunks(bytes: &[u8]) -> Vec<Vec<u8>> {
    bytes.chunks(MAX_CHUNK_BYTES).map(<[u8]>::to_vec).collect()
}

/// Joins chunks in the order given, back to the stored bytes, without decoding them:
/// compiled code is checked against its digest before anything parses it.
pub fn join_chunks<C: AsRef<[u8]>>(chunks: &[C]) -> Result<Vec<u8>, ChunkError> {
    if chunks.is_empty() {
        return Err(ChunkError::Empty);
    }
    let mut joined = Vec::new();
    for (index, chunk) in chunks.iter().enumerate() {
        let chunk = chunk.as_ref();
        if chunk.len() > MAX_CHUNK_BYTES {
            return Err(ChunkError::TooLarge {
                index,
                size: chunk.len(),
            });
        }
        joined.extend_from_slice(chunk);
    }
    Ok(joined)
}

/// Joins chunks in the order given and decompresses them back to the module's bytes.
pub fn reassemble<C: AsRef<[u8]>>(chunks: &[C]) -> Result<Vec<u8>, ChunkError> {
    let compressed = join_chunks(chunks)?;
    let decoder = zstd::stream::read::Decoder::new(compressed.as_slice()).map_err(ChunkError::Decompress)?;
    let mut wasm = Vec::new();
    decoder
        .take(MAX_MODULE_BYTES + 1)
        .read_to_end(&mut wasm)
        .map_err(ChunkError::Decompress)?;
    if wasm.len() as u64 > MAX_MODULE_BYTES {
        return Err(ChunkError::ModuleTooLarge);
    }
    Ok(wasm)
}

/// The two parts of a built function, each stored as its own set of chunks: the module
/// (what was verified and can always be compiled) and its compiled code (what a new pod
/// loads instead of compiling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Module,
    Code,
}

impl Part {
    /// The ConfigMap key that holds one chunk.
    pub fn configmap_key(self) -> &'static str {
        match self {
            Self::Module => crate::CHUNK_KEY,
            Self::Code => crate::CODE_CHUNK_KEY,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Self::Module => "module",
            Self::Code => "code",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Self::Module => ".wasm.zst",
            Self::Code => ".cwasm.lz4",
        }
    }

    /// `<fn>-module-<10 hex>-<i>` or `<fn>-code-<10 hex>-<i>`: named by the source digest,
    /// so a rebuilt source never overwrites the chunks in use.
    pub fn configmap_name(self, function: &str, source_digest: &crate::Digest, index: usize) -> String {
        format!("{function}-{}-{}-{index}", self.word(), source_digest.short())
    }

    /// Names of all `count` chunk ConfigMaps of this part, in order.
    pub fn configmap_names(self, function: &str, source_digest: &crate::Digest, count: usize) -> Vec<String> {
        (0..count)
            .map(|index| self.configmap_name(function, source_digest, index))
            .collect()
    }

    /// File name of chunk `index` in a directory of chunks (how the operator projects
    /// the chunk ConfigMaps into one volume): `0000.wasm.zst`, `0000.cwasm.lz4`.
    pub fn chunk_file_name(self, index: usize) -> String {
        format!("{index:04}{}", self.extension())
    }

    /// The chunk index of a file in a chunk directory, or `None` for any other file.
    pub fn parse_chunk_file_name(self, name: &str) -> Option<usize> {
        let digits = name.strip_suffix(self.extension())?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }
}

/// Name of the ConfigMap that holds chunk `index` of a function's module.
pub fn configmap_name(function: &str, source_digest: &crate::Digest, index: usize) -> String {
    Part::Module.configmap_name(function, source_digest, index)
}

/// Names of all `count` chunk ConfigMaps of a function's module, in order.
pub fn chunks_configmap_names(function: &str, source_digest: &crate::Digest, count: usize) -> Vec<String> {
    Part::Module.configmap_names(function, source_digest, count)
}

/// File name of module chunk `index` in a directory of chunks.
pub fn chunk_file_name(index: usize) -> String {
    Part::Module.chunk_file_name(index)
}

/// The module chunk index of a file in a chunk directory, or `None` for any other file.
pub fn parse_chunk_file_name(name: &str) -> Option<usize> {
    Part::Module.parse_chunk_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn incompressible(len: usize) -> Vec<u8> {
        // A xorshift stream: zstd cannot shrink it, so it spans several chunks.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn large_module_splits_and_reassembles() {
        let module = incompressible(3 * MAX_CHUNK_BYTES);
        let chunks = compress_and_split(&module);
        assert!(chunks.len() >= 3, "{} chunks", chunks.len());
        assert!(chunks.iter().all(|c| c.len() <= MAX_CHUNK_BYTES));
        assert_eq!(reassemble(&chunks).unwrap(), module);
    }

    #[test]
    fn chunks_out_of_order_or_missing_fail() {
        let module = incompressible(2 * MAX_CHUNK_BYTES);
        let mut chunks = compress_and_split(&module);
        chunks.swap(0, 1);
        assert!(matches!(reassemble(&chunks), Err(ChunkError::Decompress(_))));
        chunks.swap(0, 1);
        chunks.pop();
        assert!(matches!(reassemble(&chunks), Err(ChunkError::Decompress(_))));
        assert!(matches!(reassemble::<Vec<u8>>(&[]), Err(ChunkError::Empty)));
    }

    #[test]
    fn chunk_names_parse_back() {
        assert_eq!(chunk_file_name(7), "0007.wasm.zst");
        assert_eq!(parse_chunk_file_name(&chunk_file_name(12)), Some(12));
        assert_eq!(parse_chunk_file_name("..data"), None);
        assert_eq!(parse_chunk_file_name("module.sha256"), None);
        assert_eq!(parse_chunk_file_name(&Part::Code.chunk_file_name(0)), None);
        assert_eq!(Part::Code.parse_chunk_file_name("0003.cwasm.lz4"), Some(3));
        let digest = crate::Digest::of(b"source");
        assert_eq!(
            configmap_name("hello", &digest, 2),
            format!("hello-module-{}-2", digest.short())
        );
        assert_eq!(
            Part::Code.configmap_name("hello", &digest, 0),
            format!("hello-code-{}-0", digest.short())
        );
    }
}
