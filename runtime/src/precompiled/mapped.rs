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
    let reader = File::open(&path);
    let unlinked = std::fs::remove_file(&path);
    let reader = reader?;
    unlinked?;
    writer.write_all(code)?;
    Ok(reader)
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
}
