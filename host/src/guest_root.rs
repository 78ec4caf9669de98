//! The guest's working directory: the files a Function ships beside its handler (the
//! module's `wasmless.files` section, `wasmless_artifact::guest_files`), written into a
//! directory of this process's and preopened read-only as the guest's `/`. The same code
//! makes it for the snapshot's run of a Go reactor's initialisers at build time and for
//! every request at run time, so `os.ReadFile("countries.csv")` reads the same bytes in
//! both. Without files it is an empty directory: a read fails as on a machine without the
//! file.

use std::path::{Path, PathBuf};
use wasmless_artifact::guest_files::{GuestFile, path_problem};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

/// Where under a cache directory the runtime writes guests' files.
const DIR_NAME: &str = "guest-files";

/// A directory holding one module's files, removed when dropped.
#[derive(Debug)]
pub struct GuestRoot {
    path: PathBuf,
    files: usize,
    bytes: u64,
}

impl GuestRoot {
    /// `files` written into a new directory below `base` (the cache directory) or, without
    /// one, the system's temporary directory. Names are checked again: they come from a
    /// verified module, but a name that could leave the directory is never joined to it.
    pub fn new(base: Option<&Path>, files: &[GuestFile]) -> std::io::Result<Self> {
        let (parent, prefix) = match base {
            Some(base) => (base.join(DIR_NAME), format!("root-{}-", std::process::id())),
            None => (
                std::env::temp_dir(),
                format!("wasmless-guest-root-{}-", std::process::id()),
            ),
        };
        std::fs::create_dir_all(&parent)?;
        // A new directory of a random name, made by this call (mode 0700): nothing another
        // process (or an earlier one of the same id) made can be taken for it.
        let path = tempfile::Builder::new().prefix(&prefix).tempdir_in(&parent)?.keep();
        let root = Self {
            path,
            files: files.len(),
            bytes: files.iter().map(|file| file.bytes.len() as u64).sum(),
        };
        for file in files {
            if let Some(problem) = path_problem(&file.name) {
                return Err(std::io::Error::other(format!("file {:?}: {problem}", file.name)));
            }
            let target = root.path.join(&file.name);
            if let Some(folder) = target.parent() {
                std::fs::create_dir_all(folder)?;
            }
            // create_new: never through a link or over a file another name made.
            use std::io::Write;
            let mut written = std::fs::OpenOptions::new().write(true).create_new(true).open(&target)?;
            written.write_all(&file.bytes)?;
            // One time for every file, at build and at run time: what an initialiser that
            // stats a file keeps in the snapshot is what a request then sees.
            written.set_modified(std::time::UNIX_EPOCH)?;
        }
        Ok(root)
    }

    /// Removes what processes that are gone left under `base`. Another live runtime may
    /// share the cache directory (two `wasmless dev`s, a test's servers), so only the roots
    /// of processes that no longer run go, and this process's own from an earlier life of
    /// its id (a container restarted as pid 1) only on its first call.
    pub fn clear(base: &Path) {
        static FIRST: std::sync::Once = std::sync::Once::new();
        let mut first = false;
        FIRST.call_once(|| first = true);
        let own = std::process::id();
        let Ok(entries) = std::fs::read_dir(base.join(DIR_NAME)) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let pid = name
                .to_str()
                .and_then(|name| name.strip_prefix("root-"))
                .and_then(|rest| rest.split('-').next())
                .and_then(|pid| pid.parse::<u32>().ok());
            let stale = match pid {
                Some(pid) if pid == own => first,
                Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
                None => true,
            };
            if stale {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// How many files the guest sees.
    pub fn files(&self) -> usize {
        self.files
    }

    /// The bytes they hold on this process's disk.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The directory as the guest's `/` (and so its working directory), read-only: the
    /// guest can neither change a file nor make one.
    pub fn preopen(&self, wasi: &mut WasiCtxBuilder) -> wasmtime::Result<()> {
        wasi.preopened_dir(&self.path, "/", FsPerms::ReadOnly)?;
        Ok(())
    }
}

impl Drop for GuestRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_written_in_their_folders_and_removed_with_the_root() {
        let files = [
            GuestFile {
                name: "templates/index.html".into(),
                bytes: b"<p>".to_vec(),
            },
            GuestFile {
                name: "countries.csv".into(),
                bytes: b"fr".to_vec(),
            },
        ];
        let root = GuestRoot::new(None, &files).unwrap();
        assert_eq!(std::fs::read(root.path.join("templates/index.html")).unwrap(), b"<p>");
        let path = root.path.clone();
        drop(root);
        assert!(!path.exists());
    }

    #[test]
    fn clearing_keeps_the_roots_of_live_runtimes_and_removes_those_of_gone_ones() {
        let base = std::env::temp_dir().join(format!("wasmless-guest-root-clear-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        GuestRoot::clear(&base);
        let live = GuestRoot::new(
            Some(&base),
            &[GuestFile {
                name: "a.txt".into(),
                bytes: b"a".to_vec(),
            }],
        )
        .unwrap();
        // No process has id 0: what such a runtime left is stale.
        let gone = base.join(DIR_NAME).join("root-0-7");
        std::fs::create_dir_all(&gone).unwrap();
        GuestRoot::clear(&base);
        assert!(live.path.join("a.txt").exists());
        assert!(!gone.exists());
        drop(live);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_name_leaving_the_root_is_refused_before_anything_is_written_there() {
        let files = [GuestFile {
            name: "../escaped".into(),
            bytes: Vec::new(),
        }];
        assert!(GuestRoot::new(None, &files).is_err());
        assert!(!std::env::temp_dir().join("escaped").exists());
    }
}
