//! What a `put` must be before the store keeps it: the bytes as stored (compressed) that
//! hash to the digest they are put under, and that decode to code with a header. The bytes
//! are read into the agent's own memory first, so what is checked is what is written,
//! whatever the sender does to its file meanwhile.

use std::fs::File;
use std::io::Read;
use wasmless_artifact::{
    CODE_HEADER_BYTES, CodeError, CodeHeader, Digest, LIKELY_CODE_RATIO, decode_code_into, decoded_code_size,
};

/// Code that passed: its header, the `.cwasm` to write, and that file's own sha256 (kept to
/// check the file again later).
#[derive(Debug)]
pub struct Admitted {
    pub header: CodeHeader,
    /// The decompressed artifact: header block, then the `.cwasm`.
    decompressed: Vec<u8>,
    pub cwasm_sha256: Digest,
}

impl Admitted {
    pub fn cwasm(&self) -> &[u8] {
        &self.decompressed[CODE_HEADER_BYTES..]
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("{size} bytes is over the {limit} a put may bring")]
    TooLarge { size: u64, limit: u64 },
    #[error("the bytes put under {claimed} hash to {actual}: nothing was stored")]
    Digest { claimed: Digest, actual: Digest },
    #[error("the bytes are not compiled code: {0}")]
    Malformed(#[from] CodeError),
    #[error("the code decompresses to more than {LIKELY_CODE_RATIO} times its size, which compiled code does not")]
    Implausible,
    #[error("the code decompresses to {size} bytes, over the {limit} the store keeps of one")]
    Oversized { size: usize, limit: usize },
    #[error("the decompressed code is not an ELF image")]
    NotElf,
    #[error("cannot read the file sent: {0}")]
    Read(#[from] std::io::Error),
    #[error("the file sent is not a memory file sealed against writes, growing and shrinking")]
    NotSealed,
}

impl Refusal {
    /// The `reason` label and the first word of the reply.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } | Self::Oversized { .. } => "too-large",
            Self::Digest { .. } => "digest",
            Self::Malformed(_) | Self::Implausible | Self::NotElf => "malformed",
            Self::Read(_) | Self::NotSealed => "read",
        }
    }
}

/// Whether `file` is a memory file sealed against writes, growing and shrinking: only
/// such a file is read, as nothing can change it, cut it short or make a read wait on it
/// (a file of a network or FUSE mount could hold the agent's one put at a time).
pub fn sealed(file: &File) -> Result<(), Refusal> {
    use rustix::fs::SealFlags;
    let needed = SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK;
    match rustix::fs::fcntl_get_seals(file) {
        Ok(seals) if seals.contains(needed) => Ok(()),
        _ => Err(Refusal::NotSealed),
    }
}

/// The whole of `file`, from its start, if it is at most `limit` bytes.
pub fn read_sent(file: &File, limit: u64) -> Result<Vec<u8>, Refusal> {
    let size = file.metadata()?.len();
    if size > limit {
        return Err(Refusal::TooLarge { size, limit });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // From offset 0 whatever the sender's offset, and no further than the limit should the
    // file grow meanwhile.
    let mut reader = std::io::Read::take(ReadAt { file, at: 0 }, limit + 1);
    reader.read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(Refusal::TooLarge {
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

/// Reads `file` with `pread` from `at` on: the offset it shares with its sender is not used.
struct ReadAt<'a> {
    file: &'a File,
    at: u64,
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = std::os::unix::fs::FileExt::read_at(self.file, buffer, self.at)?;
        self.at += read as u64;
        Ok(read)
    }
}

/// Checks `stored` against `claimed` before anything decodes it, then decodes it, if it
/// decompresses to at most `max_decoded` bytes (nothing is allocated for it otherwise).
pub fn admit(claimed: &Digest, stored: &[u8], max_decoded: usize) -> Result<Admitted, Refusal> {
    let actual = Digest::of(stored);
    if actual != *claimed {
        return Err(Refusal::Digest {
            claimed: *claimed,
            actual,
        });
    }
    let size = decoded_code_size(stored)?;
    if size > stored.len().saturating_mul(LIKELY_CODE_RATIO) {
        return Err(Refusal::Implausible);
    }
    if size > max_decoded {
        return Err(Refusal::Oversized {
            size,
            limit: max_decoded,
        });
    }
    let mut decompressed = vec![0; size];
    let header = decode_code_into(stored, &mut decompressed)?;
    if !decompressed[CODE_HEADER_BYTES..].starts_with(b"\x7fELF") {
        return Err(Refusal::NotElf);
    }
    let cwasm_sha256 = Digest::of(&decompressed[CODE_HEADER_BYTES..]);
    Ok(Admitted {
        header,
        decompressed,
        cwasm_sha256,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wasmless_artifact::{CodeKind, encode_code};

    /// `start` and 8 KiB that LZ4 cannot shrink, as code is: the header block's 64 KiB of
    /// padding alone would decompress beyond any likely ratio.
    pub(crate) fn code_starting(start: &[u8]) -> Vec<u8> {
        let mut state = start
            .iter()
            .fold(0x9e37_79b9_7f4a_7c15_u64, |s, b| s.rotate_left(5) ^ u64::from(*b));
        let mut cwasm = start.to_vec();
        cwasm.extend((0..8 << 10).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        }));
        cwasm
    }

    fn stored(cwasm: &[u8]) -> Vec<u8> {
        let header = CodeHeader {
            module_digest: Digest::of(b"module"),
            engine: "ab".repeat(32),
            kind: CodeKind::Module,
            target: "x86-64-v3".into(),
            module_files: false,
        };
        encode_code(&header, cwasm)
    }

    #[test]
    fn code_that_hashes_to_its_digest_is_admitted_and_anything_else_is_not() {
        let cwasm = code_starting(b"\x7fELF and the rest of the code");
        let code = stored(&cwasm);
        let admitted = admit(&Digest::of(&code), &code, 1 << 20).unwrap();
        assert_eq!(admitted.cwasm(), cwasm);
        assert_eq!(admitted.cwasm_sha256, Digest::of(admitted.cwasm()));
        assert!(matches!(
            admit(&Digest::of(&code), &code, 64 << 10),
            Err(Refusal::Oversized { .. })
        ));

        let other = stored(&code_starting(b"\x7fELF other code"));
        let refused = admit(&Digest::of(&code), &other, 1 << 20).unwrap_err();
        assert_eq!(refused.reason(), "digest", "{refused}");

        let not_code = b"hello".to_vec();
        let implausible = stored(b"\x7fELF");
        assert!(matches!(
            admit(&Digest::of(&implausible), &implausible, 1 << 20),
            Err(Refusal::Implausible)
        ));
        assert_eq!(
            admit(&Digest::of(&not_code), &not_code, 1 << 20).unwrap_err().reason(),
            "malformed"
        );
        let not_elf = stored(&code_starting(b"#!/bin/sh"));
        assert!(matches!(
            admit(&Digest::of(&not_elf), &not_elf, 1 << 20),
            Err(Refusal::NotElf)
        ));
    }

    #[test]
    fn a_file_over_the_limit_is_not_read() {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[7; 100]).unwrap();
        assert_eq!(read_sent(&file, 100).unwrap().len(), 100, "read from the start");
        assert!(matches!(read_sent(&file, 99), Err(Refusal::TooLarge { size: 100, .. })));
    }
}
