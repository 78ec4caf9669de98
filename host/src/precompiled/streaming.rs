//! A new pod's code read from its files, hashed and decompressed in one pass.
//!
//! Reading the Goless sample's 5.5 MB from its ConfigMap files takes ~2–3 ms, hashing it
//! ~3 ms, decompressing it ~7.5 ms on one core. One after another on two cores that was
//! read, then hash beside decompression; here one thread reads and hashes block after
//! block, handing each block to the decompressing threads as soon as it is in memory, and
//! joins them when it has read the last one.
//!
//! The bytes are read into memory of the runtime's own (never decompressed from a mapping
//! of the files, which another writer could change between the hash and the decoder), and
//! the digest decides before anything reads what was decompressed, as in
//! [`super::verify_and_decode`]. Anything but the block format with a table that fits the
//! files is read whole and goes that way.

use super::pages::PageBuffer;
use super::{
    CodeImage, CodeRefused, Fallback, StoredBytes, StoredMemory, VerifiedCode, verify_and_decode,
    with_decompressing_threads,
};
use crate::load_phases::LoadPhases;
use crate::module_source::LoadError;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Take};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex};
use wasmless_artifact::{
    BlockSpan, CODE_PREAMBLE_BYTES, CodeBlock, CodeError, CodePreamble, Digest, code_block_spans, code_preamble,
    decoded_code_size, decompress_block,
};

/// The files of stored code (one file, or the chunks in order), opened and measured.
pub(super) struct StoredFiles {
    files: Vec<(PathBuf, File, usize)>,
    total: usize,
}

impl StoredFiles {
    /// Opens `paths`; `chunks_of`: they are the chunks of that directory, each at most
    /// `MAX_CHUNK_BYTES`.
    pub(super) fn open(paths: Vec<PathBuf>, chunks_of: Option<PathBuf>) -> Result<Self, LoadError> {
        let mut files = Vec::with_capacity(paths.len());
        for (index, path) in paths.into_iter().enumerate() {
            let file = File::open(&path).map_err(read_error(&path))?;
            let size = file.metadata().map_err(read_error(&path))?.len() as usize;
            if let Some(dir) = &chunks_of
                && size > wasmless_artifact::MAX_CHUNK_BYTES
            {
                return Err(LoadError::Chunks {
                    dir: dir.display().to_string(),
                    source: wasmless_artifact::ChunkError::TooLarge { index, size },
                });
            }
            files.push((path, file, size));
        }
        let total = files.iter().map(|(_, _, size)| size).sum();
        Ok(Self { files, total })
    }

    fn first_path(&self) -> PathBuf {
        self.files.first().map(|(path, _, _)| path.clone()).unwrap_or_default()
    }
}

fn read_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> LoadError {
    let path = path.to_path_buf();
    move |source| LoadError::Read { path, source }
}

/// The files one after another, each read to the size it had when opened: a file that
/// shrank since is an error, not a shift of every byte after it.
struct Files {
    rest: std::vec::IntoIter<(PathBuf, Take<File>)>,
    current: Option<(PathBuf, Take<File>)>,
}

impl Files {
    fn new(stored: StoredFiles) -> Self {
        let mut rest = stored
            .files
            .into_iter()
            .map(|(path, file, size)| (path, file.take(size as u64)))
            .collect::<Vec<_>>()
            .into_iter();
        let current = rest.next();
        Self { rest, current }
    }

    fn read_exact(&mut self, out: &mut [u8]) -> Result<(), LoadError> {
        let mut filled = 0;
        while filled < out.len() {
            let Some((path, file)) = &mut self.current else {
                return Err(LoadError::Read {
                    path: PathBuf::new(),
                    source: std::io::ErrorKind::UnexpectedEof.into(),
                });
            };
            match file.read(&mut out[filled..]) {
                Ok(0) if file.limit() > 0 => {
                    return Err(read_error(path)(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the file shrank while it was read",
                    )));
                }
                Ok(0) => self.current = self.rest.next(),
                Ok(read) => filled += read,
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) => return Err(read_error(path)(error)),
            }
        }
        Ok(())
    }
}

/// Reads, verifies against `pinned` and decompresses the code in `stored`.
pub(super) fn read_verify_and_decode(
    code: String,
    stored: StoredFiles,
    pinned: Digest,
    keep_stored: bool,
) -> Result<Result<VerifiedCode, Fallback>, CodeRefused> {
    let unavailable = |error| Ok(Err(Fallback::Unavailable(error)));
    let total = stored.total;
    let mut buffer = match PageBuffer::new(total) {
        Ok(buffer) => buffer,
        Err(error) => return unavailable(read_error(&stored.first_path())(error)),
    };
    let mut files = Files::new(stored);
    let bytes = &mut buffer.bytes_mut()[..total];
    let preamble_len = CODE_PREAMBLE_BYTES.min(total);
    if let Err(error) = files.read_exact(&mut bytes[..preamble_len]) {
        return unavailable(error);
    }
    let blocks_format = match code_preamble(&bytes[..preamble_len]) {
        Ok(CodePreamble::Blocks { table_bytes }) => {
            let plausible = decoded_code_size(&bytes[..preamble_len])
                .is_ok_and(|size| size <= total.saturating_mul(super::LIKELY_RATIO));
            (plausible && CODE_PREAMBLE_BYTES + table_bytes <= total).then_some(table_bytes)
        }
        _ => None,
    };
    let Some(table_bytes) = blocks_format else {
        let verified = read_whole(code, files, bytes, preamble_len, pinned);
        return super::keeping(verified, || bytes.to_vec(), keep_stored);
    };
    let (head, blocks) = bytes.split_at_mut(CODE_PREAMBLE_BYTES + table_bytes);
    if let Err(error) = files.read_exact(&mut head[CODE_PREAMBLE_BYTES..]) {
        return unavailable(error);
    }
    let spans = match code_block_spans(head) {
        Ok(spans) if spans.iter().map(|span| span.compressed_len).sum::<usize>() == blocks.len() => spans,
        _ => {
            let read = head.len();
            let verified = read_whole(code, files, &mut buffer.bytes_mut()[..total], read, pinned);
            return super::keeping(verified, || buffer.bytes()[..total].to_vec(), keep_stored);
        }
    };
    let decoded = spans.last().map_or(0, |span| span.decompressed.end);
    let mut image = match PageBuffer::new(decoded) {
        Ok(image) => image,
        Err(_) => {
            let read = head.len();
            let verified = read_whole(code, files, &mut buffer.bytes_mut()[..total], read, pinned);
            return super::keeping(verified, || buffer.bytes()[..total].to_vec(), keep_stored);
        }
    };
    let (read, failure) = decompress_while_reading(files, head, blocks, &spans, image.bytes_mut());
    let actual = match read {
        Ok(actual) => actual,
        Err(error) => return unavailable(error),
    };
    if actual != pinned {
        return Err(CodeRefused::DigestMismatch {
            code,
            expected: pinned,
            actual,
        });
    }
    Ok(match failure {
        Some(error) => Err(Fallback::Malformed(error)),
        None => {
            let stored = keep_stored.then(|| StoredBytes(StoredMemory::Pages(buffer)));
            Ok(VerifiedCode(CodeImage(image), LoadPhases::default(), stored))
        }
    })
}

/// Reads the rest of the stored bytes (the first `read` are in) and verifies and
/// decompresses them whole.
fn read_whole(
    code: String,
    mut files: Files,
    bytes: &mut [u8],
    read: usize,
    pinned: Digest,
) -> Result<Result<VerifiedCode, Fallback>, CodeRefused> {
    if let Err(error) = files.read_exact(&mut bytes[read..]) {
        return Ok(Err(Fallback::Unavailable(error)));
    }
    verify_and_decode(code, bytes, pinned)
}

/// Blocks read and hashed, waiting for a thread to decompress them.
struct Queue<'a> {
    blocks: VecDeque<(CodeBlock<'a>, &'a mut [u8])>,
    reading: bool,
}

/// One thread reads `blocks` (after `head`, already read) block by block, hashing as it
/// goes, then decompresses too; the others decompress each block once it is read.
/// Returns the digest of everything read, and the first block that did not decompress.
fn decompress_while_reading<'a>(
    mut files: Files,
    head: &'a [u8],
    mut blocks: &'a mut [u8],
    spans: &[BlockSpan],
    mut out: &'a mut [u8],
) -> (Result<Digest, LoadError>, Option<CodeError>) {
    let queue = Mutex::new(Queue {
        blocks: VecDeque::with_capacity(spans.len()),
        reading: true,
    });
    let read_one = Condvar::new();
    let failure = Mutex::new(None);
    let decompress = || {
        loop {
            let mut waiting = queue.lock().expect("no panic holds the lock");
            let next = loop {
                if let Some(next) = waiting.blocks.pop_front() {
                    break Some(next);
                }
                if !waiting.reading {
                    break None;
                }
                waiting = read_one.wait(waiting).expect("no panic holds the lock");
            };
            drop(waiting);
            let Some((block, out)) = next else { return };
            if let Err(error) = decompress_block(&block, out) {
                failure.lock().expect("no panic holds the lock").get_or_insert(error);
                return;
            }
        }
    };
    let started = std::time::Instant::now();
    let reading = || {
        let mut hasher = Digest::hasher();
        hasher.update(head);
        let mut read = || -> Result<(), LoadError> {
            for span in spans {
                let (compressed, rest) = std::mem::take(&mut blocks).split_at_mut(span.compressed_len);
                blocks = rest;
                files.read_exact(compressed)?;
                hasher.update(compressed);
                let (into, rest) = std::mem::take(&mut out).split_at_mut(span.decompressed.len());
                out = rest;
                let block = CodeBlock {
                    compressed,
                    decompressed: span.decompressed.clone(),
                };
                queue
                    .lock()
                    .expect("no panic holds the lock")
                    .blocks
                    .push_back((block, into));
                read_one.notify_one();
            }
            Ok(())
        };
        let read = read();
        tracing::debug!(read_and_hash_ms = started.elapsed().as_secs_f64() * 1000.0, "code read");
        queue.lock().expect("no panic holds the lock").reading = false;
        read_one.notify_all();
        read.map(|()| hasher.finish())
    };
    let read = with_decompressing_threads(reading, decompress);
    tracing::debug!(
        decompressed_ms = started.elapsed().as_secs_f64() * 1000.0,
        "code decompressed"
    );
    (read, failure.into_inner().expect("no panic holds the lock"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmless_artifact::{CODE_BLOCK_BYTES, CODE_HEADER_BYTES, CodeHeader, CodeKind, encode_code};

    /// Code of three blocks (the last one short), as the builder stores it: bytes LZ4
    /// cannot shrink, so that the stored blocks are as long as the code and cross files.
    fn stored_code() -> (Vec<u8>, Vec<u8>) {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let cwasm: Vec<u8> = (0..2 * CODE_BLOCK_BYTES + 4321)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let header = CodeHeader {
            module_digest: Digest::of(b"module"),
            engine: "ab".repeat(32),
            kind: CodeKind::Module,
            target: "x86-64-v3".into(),
            module_files: false,
        };
        (encode_code(&header, &cwasm), cwasm)
    }

    /// `stored` in files of the sizes in `cuts`, the last repeated to the end: cut inside
    /// the preamble, the table and blocks.
    fn in_files(dir: &std::path::Path, stored: &[u8], cuts: &[usize]) -> StoredFiles {
        let mut rest = stored;
        let mut paths = Vec::new();
        while !rest.is_empty() {
            let cut = cuts[paths.len().min(cuts.len() - 1)].min(rest.len());
            let path = dir.join(format!("{:04}.cwasm.lz4", paths.len()));
            std::fs::write(&path, &rest[..cut]).unwrap();
            paths.push(path);
            rest = &rest[cut..];
        }
        StoredFiles::open(paths, None).unwrap()
    }

    fn decoded(result: Result<Result<VerifiedCode, Fallback>, CodeRefused>) -> Vec<u8> {
        match result {
            Ok(Ok(VerifiedCode(image, _, _))) => image.decompressed().to_vec(),
            Ok(Err(fallback)) => panic!("fell back: {fallback}"),
            Err(refused) => panic!("refused: {refused}"),
        }
    }

    #[test]
    fn code_cut_anywhere_into_files_decodes_to_what_was_stored() {
        let (stored, cwasm) = stored_code();
        assert!(stored.len() > 2 * CODE_BLOCK_BYTES, "{} bytes stored", stored.len());
        for cuts in [&[7, 13, 20, 700_000][..], &[100_000], &[stored.len()]] {
            let dir = tempfile::tempdir().unwrap();
            let plain = decoded(read_verify_and_decode(
                "code".into(),
                in_files(dir.path(), &stored, cuts),
                Digest::of(&stored),
                false,
            ));
            assert_eq!(plain[CODE_HEADER_BYTES..], cwasm[..], "cut {cuts:?}");
        }
    }

    /// Whichever byte was changed — preamble, block table or a block — the digest refuses
    /// it before anything reads what was decompressed, and no fallback runs it either.
    #[test]
    fn a_changed_byte_anywhere_is_refused() {
        let (stored, _) = stored_code();
        for at in [2, 5, 9, 13, 17, 30, stored.len() / 2, stored.len() - 1] {
            let mut changed = stored.clone();
            changed[at] ^= 0x41;
            let dir = tempfile::tempdir().unwrap();
            let result = read_verify_and_decode(
                "code".into(),
                in_files(dir.path(), &changed, &[11, 600_000]),
                Digest::of(&stored),
                false,
            );
            assert!(
                matches!(result, Err(CodeRefused::DigestMismatch { .. })),
                "byte {at} changed: {:?}",
                result.map(|r| r.map(|_| ()).map_err(|f| f.to_string()))
            );
        }
    }

    #[test]
    fn a_file_that_shrinks_while_it_is_read_makes_the_code_unavailable() {
        let (stored, _) = stored_code();
        let dir = tempfile::tempdir().unwrap();
        let files = in_files(dir.path(), &stored, &[1_000_000]);
        std::fs::write(dir.path().join("0001.cwasm.lz4"), b"short").unwrap();
        let result = read_verify_and_decode("code".into(), files, Digest::of(&stored), false);
        match result {
            Ok(Err(Fallback::Unavailable(error))) => assert!(error.to_string().contains("shrank"), "{error}"),
            other => panic!("expected unavailable code, got {:?}", other.map(|r| r.map(|_| ()))),
        }
    }
}
