//! Verified code the pool maps from a file instead of copying into its own memory.
//!
//! wasmtime maps a code file privately and only changes its pages' protections (the code
//! has no relocations), so its pages stay the file's: clean page-cache pages, read in
//! where touched and dropped under pressure, never the process's own memory. A Go
//! Function's 14 MiB of Go runtime then costs the pool the pages its requests touch, not
//! a private copy of all of it; its data image (the snapshot's memory) is copy-on-write
//! from the same file rather than a copy in a memfd.
//!
//! The file is the pool's own: created in its cache directory (an emptyDir of its pod),
//! opened read-only and unlinked before a byte is written, so no other process finds it
//! by name, and it disappears with the module's last clone. Only bytes already checked
//! against the pinned digest are written to it.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use wasmless_artifact::CodeKind;
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where the pool writes the code it maps: a directory of its own in the cache directory.
pub fn dir_in(cache_dir: &Path) -> PathBuf {
    cache_dir.join("mapped-code")
}

/// `code` written to a new file in `dir` that only the returned read-only handle reaches.
/// The handle is opened through the writer's own descriptor, not by name, so it is the
/// file this process made whatever happens to the name meanwhile.
pub(super) fn write_unlinked(dir: &Path, code: &[u8]) -> std::io::Result<File> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!(
        "{}-{}.cwasm",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let mut writer = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    let reader = File::open(format!("/proc/self/fd/{}", writer.as_raw_fd()));
    let unlinked = std::fs::remove_file(&path);
    let reader = reader?;
    unlinked?;
    writer.write_all(code)?;
    Ok(reader)
}

/// Bytes of the metadata wasmtime decodes into the process's memory as it loads `cwasm`
/// (its `.wasmtime.info` section): what mapped code still costs privately grows with it.
/// The whole artifact when the section cannot be found, which counts it as a copy.
pub(super) fn metadata_bytes(cwasm: &[u8]) -> u64 {
    elf_section_size(cwasm, b".wasmtime.info").unwrap_or(cwasm.len() as u64)
}

/// [`metadata_bytes`] of the code in `file`, read through a mapping of it (only the pages
/// the section table is on are read in). The file's size when it cannot be mapped.
pub(super) fn metadata_of_file(file: &File) -> u64 {
    let Ok(len) = file.metadata().map(|metadata| metadata.len() as usize) else {
        return u64::MAX;
    };
    if len == 0 {
        return 0;
    }
    // SAFETY: a private read-only mapping of the whole file, read and unmapped here.
    let mapped = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            rustix::mm::ProtFlags::READ,
            rustix::mm::MapFlags::PRIVATE,
            file,
            0,
        )
    };
    let Ok(memory) = mapped else {
        return len as u64;
    };
    // SAFETY: the mapping just made, `len` bytes, readable; the file is never written.
    let metadata = metadata_bytes(unsafe { std::slice::from_raw_parts(memory.cast::<u8>(), len) });
    // SAFETY: the mapping made above, no longer borrowed.
    let _ = unsafe { rustix::mm::munmap(memory, len) };
    metadata
}

/// The size of the section `name` of the ELF64 (little-endian) image `elf`.
fn elf_section_size(elf: &[u8], name: &[u8]) -> Option<u64> {
    let u16_at = |at: usize| Some(u16::from_le_bytes(elf.get(at..at + 2)?.try_into().ok()?));
    let u32_at = |at: usize| Some(u32::from_le_bytes(elf.get(at..at + 4)?.try_into().ok()?));
    let u64_at = |at: usize| Some(u64::from_le_bytes(elf.get(at..at + 8)?.try_into().ok()?));
    if elf.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let table = usize::try_from(u64_at(0x28)?).ok()?;
    let entry = usize::from(u16_at(0x3a)?);
    let count = usize::from(u16_at(0x3c)?);
    let names = usize::from(u16_at(0x3e)?);
    let header = |index: usize| table.checked_add(index.checked_mul(entry)?);
    let names_offset = usize::try_from(u64_at(header(names)? + 0x18)?).ok()?;
    (0..count).find_map(|index| {
        let at = header(index)?;
        let name_at = names_offset.checked_add(usize::try_from(u32_at(at)?).ok()?)?;
        let found = elf.get(name_at..name_at.checked_add(name.len() + 1)?)?;
        (found[..name.len()] == *name && found[name.len()] == 0).then_some(())?;
        u64_at(at + 0x20)
    })
}

/// Loads the code in `file` for `engine`, mapped.
///
/// # Safety
///
/// `file` holds code checked against the pinned digest, and nothing writes to it any more
/// (a handle from [`write_unlinked`], whose writer is gone).
pub(super) unsafe fn load(engine: &Engine, kind: CodeKind, file: File) -> wasmtime::Result<crate::compile::Compiled> {
    use crate::compile::Compiled;
    // SAFETY: as this function's contract; wasmtime checks the ELF header, flags and the
    // engine's settings again as it maps the file.
    unsafe {
        match kind {
            CodeKind::Module => wasmtime::Module::deserialize_open_file(engine, file).map(Compiled::Module),
            // wasmtime 48 opens a component's file by path only: the unlinked file's path
            // is its descriptor's, and wasmtime keeps a handle of its own.
            CodeKind::Component => {
                let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
                Component::deserialize_file(engine, path).map(Compiled::Component)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_written_file_is_reachable_only_through_its_handle() {
        let dir = tempfile::tempdir().unwrap();
        let file = write_unlinked(dir.path(), b"code").unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the file was left by name"
        );
        let mut read = String::new();
        std::io::Read::read_to_string(&mut &file, &mut read).unwrap();
        assert_eq!(read, "code");
        let mut writable = &file;
        assert!(writable.write_all(b"x").is_err(), "the handle can write to the code");
    }

    #[test]
    fn the_metadata_is_the_info_section_of_compiled_code() {
        let engine = crate::precompiled::precompile_engine().unwrap();
        let wat = "(module (func (export \"f\") (param i32 i64) (result f32) f32.const 0))";
        let cwasm = engine.precompile_module(&wat::parse_str(wat).unwrap()).unwrap();
        let metadata = metadata_bytes(&cwasm);
        assert!(metadata > 0 && metadata < 4096, "{metadata} of {}", cwasm.len());
        assert_eq!(metadata_bytes(b"not code"), 8, "unknown bytes count whole");
        assert_eq!(elf_section_size(&cwasm[..100], b".wasmtime.info"), None);
    }
}
